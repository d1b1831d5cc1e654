"""Built-in plugin: records (see the module docstring once written)."""
