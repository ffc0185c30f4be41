"""`python -m dif_tools ...` runs the `dif` command."""

from dif_tools.cli import main

if __name__ == "__main__":
    main()
