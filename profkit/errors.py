"""Exceptions.  Library code raises these; only the CLI turns them into exit codes."""


class ProfkitError(Exception):
    """Base class: the message says what went wrong and what to do."""


class ToolNotFound(ProfkitError):
    pass


class CommandFailed(ProfkitError):
    def __init__(self, message: str, argv: list[str] | None = None, returncode: int | None = None,
                 output_tail: str = ""):
        super().__init__(message)
        self.argv = argv or []
        self.returncode = returncode
        self.output_tail = output_tail


class BuildError(ProfkitError):
    def __init__(self, message: str, step: str = "", log_path: str | None = None):
        super().__init__(message)
        self.step = step
        self.log_path = log_path


class PatchError(BuildError):
    pass


class ClusterError(ProfkitError):
    pass


class ParseError(ProfkitError):
    pass


class ProbeError(ProfkitError):
    pass


class ComparisonError(ProfkitError):
    pass
