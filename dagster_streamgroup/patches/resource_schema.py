"""The config schema of this package's resources inferred once per class instead of at every build.

Dagster infers a ``ConfigurableResource``'s config schema from its class each time it constructs one
(``infer_schema_from_config_class`` in ``ConfigurableResourceFactory.__init__``), and building a resource for a
sensor evaluation or a run constructs it three times (the resource, then copies with the init context and with
the resolved values). A group resource has some forty fields, so that is about 4-5 ms per construction: in a
member tick measured in-process, a third of its CPU. The schema is a function of the class, the description and
the fields left out; Dagster copies it before applying values (``copy_with_default``) and never changes it, so
one inferred schema per (class, description, fields left out) gives the same answers. Only the classes of this
package are kept (a bounded few); every other class goes to Dagster's function as before.

Dagster's modules are imported only once the guard (``dagster_streamgroup.patches.enabled``) allows it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dagster_streamgroup import patches

PACKAGE = "dagster_streamgroup."

_infer: Callable[..., Any] | None = None
"""Dagster's ``infer_schema_from_config_class``, kept by ``install`` (the function it replaces)."""

_inferred: dict[tuple[type[Any], str | None, frozenset[str]], Any] = {}
"""Schemas by (class, description, fields left out): as many as the package has resource classes."""


def infer_schema_from_config_class(
    model_cls: type[Any],
    description: str | None = None,
    fields_to_omit: set[str] | None = None,
    default: Any | None = None,
) -> Any:
    """Dagster's ``infer_schema_from_config_class``, kept per class for this package's resource classes."""
    infer = _infer
    if infer is None:  # only installed once _infer is set; reached only if called directly before that
        from dagster._config.pythonic_config import config as pythonic_config

        infer = pythonic_config.infer_schema_from_config_class
    if default is not None or not model_cls.__module__.startswith(PACKAGE):
        return infer(model_cls, description, fields_to_omit, default)
    key = (model_cls, description, frozenset(fields_to_omit or ()))
    schema = _inferred.get(key)
    if schema is None:
        schema = _inferred[key] = infer(model_cls, description=description, fields_to_omit=set(key[2]))
    return schema


def install() -> bool:
    """Make Dagster's resource construction use the kept schemas; False on a Dagster the patches were not
    verified on, or where its function is not the one this module knows (it is then left alone)."""
    global _infer  # noqa: PLW0603 (the function replaced, kept once for the process)
    if not patches.enabled():
        return False
    from dagster._config.pythonic_config import config as pythonic_config
    from dagster._config.pythonic_config import resource as pythonic_resource

    module: Any = pythonic_resource
    current = getattr(module, "infer_schema_from_config_class", None)
    if current is infer_schema_from_config_class:
        return True
    if current is not pythonic_config.infer_schema_from_config_class:
        return False
    _infer = current
    module.infer_schema_from_config_class = infer_schema_from_config_class
    return True
