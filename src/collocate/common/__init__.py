"""What every layer may use: errors, units, safe text, SQLite, TLS, plots, and how commands are declared
(options, help text, errors as the CLI prints them). Imports nothing else of collocate."""
