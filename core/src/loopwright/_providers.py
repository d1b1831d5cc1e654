"""Components of registered kinds built from the assembly, and the providers of model references.

:func:`build_component` builds a store, a record sink, an engine or a provider from its kind
and options, checking them first against the JSON Schema its plugin registered, and placing
each problem at its line and column in the assembly (:func:`assembly_error`). A
:class:`Providers` turns ``PROVIDER:MODEL`` references into providers, built once each, and
prices what a call used.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from loopwright._pricing import PriceTable
from loopwright._suggest import did_you_mean
from loopwright.abc import ProviderSettings
from loopwright.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from loopwright._definition import Assembly, Definition
    from loopwright._plugins import PluginHost
    from loopwright._types import Cost, Usage
    from loopwright.abc import Provider

__all__ = ["Providers", "assembly_error", "build_component"]


class Providers:
    """The providers of one runtime, built on first use from the assembly or a registered kind.

    Attributes:
        assembly: The runtime's assembly.
        prices: The price table (the assembly's ``pricing``, then genai-prices).
        http_client: The ``httpx.AsyncClient`` handed to every provider built here, if any.
    """

    def __init__(self, assembly: Assembly, plugins: PluginHost, http_client: Any = None) -> None:
        """Resolve against ``assembly`` and the provider kinds ``plugins`` registered."""
        self.assembly = assembly
        self.plugins = plugins
        self.http_client = http_client
        self.prices = PriceTable(assembly.pricing)
        self._providers: dict[str, Provider] = {}

    async def aclose(self) -> None:
        """Close every provider built here."""
        for provider in self._providers.values():
            await provider.aclose()

    def split_model(self, ref: str) -> tuple[str, str]:
        """Split ``PROVIDER:MODEL`` into its two parts."""
        provider, sep, model = ref.partition(":")
        if not sep or not provider:
            raise ConfigError(f"model reference {ref!r} is not of the form PROVIDER:MODEL")
        return provider, model

    def model_ref(self, definition: Definition) -> str:
        """Return the definition's model, or the assembly's default."""
        ref = definition.model or self.assembly.default_model
        if not ref:
            raise ConfigError(f"definition {definition.name!r} names no model and the assembly has no defaultModel")
        return ref

    def provider(self, name: str) -> Provider:
        """Return the provider ``name``: an assembly entry, else a registered kind with defaults."""
        found = self._providers.get(name)
        if found is not None:
            return found
        cfg = self.assembly.providers.get(name)
        if cfg is None and name not in self.plugins.providers:
            entries = ", ".join(sorted(self.assembly.providers)) or "none"
            near = did_you_mean(name, [*self.assembly.providers, *self.plugins.providers.names()])
            raise ConfigError(f"unknown provider {name!r}{near}: the assembly's providers are {entries}, and no "
                              f"provider kind {name!r} is registered (kinds: "
                              f"{', '.join(self.plugins.providers.names()) or 'none'})")
        at = ("providers", name)
        api_key = None
        if cfg is not None:
            api_key = cfg.api_key
            if cfg.api_key_env:
                api_key = os.environ.get(cfg.api_key_env)
                if api_key is None:
                    raise assembly_error(
                        self.assembly,
                        f"provider {name!r}: the environment variable {cfg.api_key_env} (its apiKeyEnv) is not set",
                        (*at, "apiKeyEnv"))
        kind = cfg.kind if cfg else name
        options = {k: v for k, v in cfg.options.items() if k != "stream"} if cfg else {}
        settings = ProviderSettings(name=name, kind=kind, base_url=cfg.base_url if cfg else None, api_key=api_key,
                                    options=options, http_client=self.http_client,
                                    base_dir=self.assembly.base_dir)
        made: Provider = build_component(self.assembly, self.plugins.providers, kind, options, at,
                                         what=f"provider {name!r}", make=lambda factory: factory(settings))
        self._providers[name] = made
        return made

    def provider_streams(self, name: str) -> bool:
        """Return whether the assembly asks provider ``name`` to stream (``stream: true``)."""
        cfg = self.assembly.providers.get(name)
        return bool(cfg is not None and cfg.options.get("stream"))

    def price(self, usage: Usage, provider_name: str, model: str) -> Cost:
        """Return what ``usage`` cost on ``provider_name:model`` (unknown prices stay unknown)."""
        provider = self._providers.get(provider_name)
        free = bool(getattr(provider, "free", False))
        price_id = getattr(provider, "price_provider_id", None)
        if price_id is None and not free:
            cfg = self.assembly.providers.get(provider_name)
            price_id = None if cfg else provider_name
        if f"{provider_name}:{model}" in self.assembly.pricing:
            price_id = provider_name
        return self.prices.cost(usage, model=model, price_provider=price_id, free=free)



def build_component(
    assembly: Assembly, registry: Any, kind: str, options: Mapping[str, Any], at: tuple[str | int, ...], *,
    what: str, make: Callable[[Any], Any],
) -> Any:
    """Build a component of a registered ``kind`` (a store, a sink, a provider) from its options.

    The options are checked first against the JSON Schema its plugin registered, if any; a
    problem the factory finds is placed at its key in the assembly as well.

    :param assembly: The assembly the component is configured in.
    :param at: Where the component's mapping sits in the assembly (``("providers", "local")``).
    :param what: The component, for messages (``provider 'local'``).
    :param make: Calls the factory with the component's settings.
    :raises ConfigError: The kind is not registered (naming the registered kinds), or the
        options are unknown or ill-typed; each problem with file, line and column.
    """
    from loopwright._config import option_problems, placed  # noqa: PLC0415 - YAML machinery only when needed

    if kind not in registry:
        raise assembly_error(
            assembly, f"{what}: unknown {registry.kind} kind {kind!r}{did_you_mean(kind, registry.names())}; "
            f"registered {registry.kind} kinds: "
            f"{', '.join(registry.names()) or 'none'}", (*at, "kind"))
    declared = registry.options_of(kind)
    file = assembly.path
    if declared is not None:
        problems = option_problems(declared, options, at=at, file=file)
        if problems:
            raise ConfigError(f"invalid options for {what}", path=str(file) if file else None, problems=problems)
    try:
        return make(registry.get(kind))
    except ConfigError as exc:
        if file is None or (exc.problems and all(p.file is not None for p in exc.problems)):
            raise
        if not exc.problems:
            raise assembly_error(assembly, str(exc), at) from None
        raise ConfigError(str(exc.args[0]).split("\n", 1)[0], path=str(file),
                          problems=placed(exc.problems, file)) from None


def assembly_error(assembly: Assembly, message: str, at: tuple[str | int, ...], *, key: bool = False) -> ConfigError:
    """Return a ConfigError for a problem at ``at`` in the assembly, placed at its line and column."""
    from loopwright._config import locate  # noqa: PLC0415 - only when something is wrong

    return ConfigError(message, path=str(assembly.path) if assembly.path else None,
                       problems=[locate(message, at, assembly.path, key=key)])
