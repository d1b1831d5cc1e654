"""The private modules behind :mod:`loopwright.http`; import from :mod:`loopwright.http` instead.

- :mod:`._transports`: :class:`ShardedTransport`, :class:`AiohttpTransport`, the shared SSL context.
- :mod:`._options`: :class:`OptionReader`, :class:`HTTPOptions`, and building a client on a transport.
- :mod:`._errors`: error statuses and httpx exceptions as ``ProviderError`` s.
- :mod:`._sse`: :class:`SSEDecoder` and :class:`SSEEvent`.
- :mod:`._endpoint`: :class:`Endpoint`, :func:`parse_tool_arguments` and :class:`ToolsCache`.
"""
