"""The base of every user-facing error: bad flags, inputs, files. The CLI prints these as one line;
anything else is a bug and keeps its traceback."""


class ZeppelinError(ValueError):
    pass
