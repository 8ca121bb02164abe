"""``python -m scheduler``: the operator command line."""

from scheduler.cli import main

if __name__ == "__main__":
    main()
