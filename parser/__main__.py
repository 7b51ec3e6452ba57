"""`python -m parser <command> ...` is `parser <command> ...` (parser.cli)."""
from parser.cli import main

if __name__ == "__main__":
    main()
