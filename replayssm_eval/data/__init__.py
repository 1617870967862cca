"""Text sources: the bundled evaluation text, PG-19 through `datasets`, and local files."""
