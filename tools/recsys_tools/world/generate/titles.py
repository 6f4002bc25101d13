"""Words for a generated catalog: the demo's items get a title and a genre, so its answer
reads as a product's would. Drawn from the seed: the same world, the same titles."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

GENRES = (
    "drama", "comedy", "thriller", "documentary", "romance", "science fiction", "animation",
    "crime", "adventure", "horror", "musical", "western", "family", "history", "fantasy",
    "mystery", "war", "sport", "biography", "film noir", "action", "satire", "superhero",
    "disaster", "martial arts", "coming of age", "heist", "space opera", "cyberpunk", "spy",
    "courtroom", "road movie", "period piece", "psychological", "slasher", "mockumentary",
    "nature", "travel", "cooking", "true crime", "political", "teen", "anthology", "silent",
    "experimental", "dance", "concert", "stand-up", "kids", "anime", "epic", "legal",
    "medical", "sitcom", "reality", "game show", "talk show", "news", "music video",
    "short film", "fairy tale", "mythology", "post-apocalyptic", "time travel",
)  # fmt: skip
_FIRST = (
    "Quiet", "Last", "Golden", "Broken", "Northern", "Silent", "Hidden", "Electric", "Paper",
    "Distant", "Velvet", "Winter", "Crimson", "Lucky", "Wild", "Midnight", "Salt", "Glass",
    "Second", "Borrowed",
)  # fmt: skip
_SECOND = (
    "Harbor", "Summer", "Letters", "Engine", "Garden", "Frontier", "Orchard", "Signal",
    "Kingdom", "Station", "Tide", "Archive", "Parade", "Lantern", "Compass", "Meridian",
    "Circus", "Island", "Witness", "Bridge",
)  # fmt: skip


def genre_names(n_categories: int) -> list[str]:
    """A name for each generated category; past the list, numbered."""
    return [GENRES[c] if c < len(GENRES) else f"genre {c + 1}" for c in range(n_categories)]


def generated_titles(n_items: int, seed: int) -> npt.NDArray[np.str_]:
    """Distinct titles: two words, then a sequel's number once the pairs run out."""
    rng = np.random.default_rng(seed)
    pairs = [f"{a} {b}" for a in _FIRST for b in _SECOND]
    order = rng.permutation(len(pairs))
    titles = [
        pairs[order[i % len(pairs)]] + (f" {i // len(pairs) + 1}" if i >= len(pairs) else "")
        for i in range(n_items)
    ]
    return np.asarray(titles, dtype=np.str_)


def generated_attributes(
    categories: npt.NDArray[np.int64], seed: int
) -> dict[str, npt.NDArray[np.str_]]:
    names = genre_names(int(categories.max()) + 1 if len(categories) else 0)
    return {
        "title": generated_titles(len(categories), seed),
        "categories": np.asarray([names[c] for c in categories.tolist()], dtype=np.str_),
    }
