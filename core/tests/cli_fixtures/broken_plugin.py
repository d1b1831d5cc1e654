"""A plugin that fails on import, for the CLI's error reporting."""

raise RuntimeError("this plugin is broken on purpose")
