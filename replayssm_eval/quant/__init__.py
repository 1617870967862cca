"""Round-trip error tables of the state formats (`measure`), printed by the `formats` command."""
