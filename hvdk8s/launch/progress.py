"""How people see a job: rank 0's events drawn (a progress bar per epoch on a terminal, plain lines
elsewhere) and every other line of output as the rank printed it. The local launch and `hvdk8s logs`
both draw through it."""
from __future__ import annotations

from hvdk8s import events, logformat


class ProgressView:
    """A progress bar per epoch where the console is a terminal; plain lines elsewhere."""

    def __init__(self, console):
        self.console = console
        self.progress = None
        self.task = None

    def passthrough(self, line: str) -> None:
        # As the rank printed it: mpirun's `[1,0]<stdout>:` tag goes; a rank other than 0 is still named.
        rank, _, body = logformat.split_tag(line)
        line = body if rank in (None, 0) else f"[rank {rank}] {body}"
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)
        self.console.file.flush()  # live through pipes too (`hvdk8s launch ... | tee log`)

    def fail(self, message: str) -> None:
        self.console.print("error: " + message, markup=False, highlight=False, style="bold red")

    def exit(self, code: int, status: str, message: str = "") -> None:
        """Nothing: for people the command says how a job ended, on stderr."""

    def show(self, event: dict) -> None:
        kind = event["event"]
        if kind == "progress":
            if self.console.is_terminal:
                try:
                    self._bar(event)
                except (KeyError, TypeError, ValueError):  # a malformed event is not worth a crash
                    pass
            return
        self._close_bar()
        text = events.format_text(event)
        style = {"done": "bold green", "epoch": None, "start": "bold"}.get(kind)
        self.console.print(text, style=style, markup=False, highlight=False, soft_wrap=True)
        self.console.file.flush()

    def _bar(self, event: dict) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        if self.progress is None:
            self.progress = Progress(TextColumn("epoch {task.fields[epoch]}"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("loss {task.fields[loss]:.4f}"),
                                     TextColumn("{task.fields[rate]:.0f} samples/s"), TimeElapsedColumn(),
                                     console=self.console, transient=True)
            self.progress.start()
            self.task = self.progress.add_task("train", total=event["steps"], epoch=event["epoch"], loss=0.0, rate=0.0)
        self.progress.update(self.task, completed=event["step"], epoch=event["epoch"], loss=event["loss"],
                             rate=event["samples_per_s"])

    def _close_bar(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def close(self) -> None:
        self._close_bar()
