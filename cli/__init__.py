"""kiln's command line (`kiln` or `python -m kiln`): parsing, commands, the live display and
the printed reports. Nothing imports it."""
