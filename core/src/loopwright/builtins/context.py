"""Built-in plugin: context (see the module docstring once written)."""
