"""One module per report section; each exposes ``section(ctx) -> str | None``."""
