"""``python -m collocate.cli``: the ``collocate`` command, run by the interpreter given."""

from collocate.cli import main

main()
