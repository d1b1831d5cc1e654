"""Plugins that ship inside loopwright-core.

Each module here is an ordinary plugin, registered first (see ``BUILTIN_PLUGINS`` in
``loopwright._plugins``) through the same hooks a third party uses.
"""
