from .cli.boot import run

run()
