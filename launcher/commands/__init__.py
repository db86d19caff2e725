"""One module per subcommand; each exports ``command``."""
