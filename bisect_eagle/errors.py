"""The one error type for bad user input: the CLI prints its message on one line and exits with code
2."""


class BadInput(ValueError):
    """Input that cannot be used as given; the message names the file, the key, what was expected
    and found."""
