"""Built-in `dif` subcommands, one module each, imported only when the subcommand is invoked."""
