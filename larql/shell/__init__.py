"""The interactive shell and how results look: what a person at a terminal (or in Jupyter) sees.

    repl.py           `larql repl`: the prompt_toolkit session, statements ending in ';'
    repl_config.py    the shell's settings file and history path
    meta_commands.py  the dot commands (.help, .use, ...), registered by a decorator
    render.py         a Result as a rich table, JSON, CSV or Markdown on a console
    progress.py       one transient progress display per statement, on stderr
    plot.py           results as matplotlib figures (`from larql import plot`; the extra `larql[plot]`)
"""
