"""One module per command: ``register(subparsers)`` adds its parser, ``run(args)`` does it and
hands its result to the one way of showing results (see :mod:`gpuslate.cli.main`'s table)."""
