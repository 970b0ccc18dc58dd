"""One module per ``zeppelin`` sub-command; each has ``add_parser(subparsers)`` and ``run(args)``."""
