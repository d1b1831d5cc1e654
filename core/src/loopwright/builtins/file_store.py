"""Built-in plugin: file_store (see the module docstring once written)."""
