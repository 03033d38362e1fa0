"""Counts in words: `1 token`, `2 tokens` (the summary lines of every command)."""


def plural(n: int, word: str, many: str | None = None) -> str:
    """`n word` with thousands separators, the word in the plural unless n is 1 (`many` for an
    irregular plural)."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"
