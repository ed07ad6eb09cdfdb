"""argparse types for numbers, shared by the commands' flags (cli, sim, plan, profile).

Kept apart from cli.py so that a command with few needs (`tandem profile --roofline`) does not
import the load generator (and matplotlib) to read its flags."""
import argparse


def number(cast, ok, must, noun=None):
    """An argparse type: `cast`(text), which must pass `ok`, else "must be {must}, not {text}"."""
    noun = noun or ("an integer" if cast is int else "a number")

    def parse(text):
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not {noun}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {must}, not {text}")
        return value
    parse.__name__ = cast.__name__
    return parse


def positive(cast):
    """`cast`(text) > 0 (inf passes for float)."""
    return number(cast, lambda value: value > 0, "positive", noun=f"a valid {cast.__name__}")


ratio = number(float, lambda value: 0 < value <= 1, "in (0, 1]")
