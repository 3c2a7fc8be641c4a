"""`python -m omrl` runs the `omrl` command line (the chaos harness starts commands this way)."""

from omrl.cli.main import cli

if __name__ == "__main__":
    cli()
