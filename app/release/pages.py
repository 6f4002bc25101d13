"""The pages a request may be served on, each with its rules resolved once.

The schema names the pages (its context block's one-hot); the rules file may give any of them
a section (`[pages.product]`) that sizes the candidate sources and replaces rerank's rules on
that page. A request on a page the schema does not name is served as `other`, as the model
sees it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from app.core.errors import ConfigError
from app.release.rules import PageSources, RerankRules
from app.world.schema import FeatureSchema

OTHER = "other"


@dataclass(frozen=True, slots=True)
class Page:
    """What a request on this page is served by: each source's size, and rerank's rules."""

    name: str
    sources: PageSources
    rules: RerankRules


def resolve_pages(schema: FeatureSchema, rules: RerankRules) -> dict[str, Page]:
    """Every schema page, resolved; a section for a page the schema lacks is refused."""
    unknown = sorted(set(rules.pages) - set(schema.pages))
    if unknown:
        raise ConfigError(
            f"the rules file has sections for pages {unknown} that the schema does not name "
            f"(its pages: {list(schema.pages)})"
        )
    return {name: Page(name, rules.sources_on(name), rules.on_page(name)) for name in schema.pages}


def page_named(pages: Mapping[str, Page], name: str) -> Page:
    """The page a request names, or `other` for a name the schema lacks."""
    found = pages.get(name)
    return pages[OTHER] if found is None else found
