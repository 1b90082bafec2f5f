"""The run store: one folder per run under ``runs/``, plain files only.

``runs/<id>/``
  config.json     the resolved configuration (written once, atomically)
  status.json     state, pid, host, times, heartbeat, exit code, error (atomic rewrites)
  .status.lock    flock'ed by each writer of status.json from its read to its rename
  .worker.lock    flock'ed by the run's worker for its whole life (fslab.core.worklock)
  .stop-request   asks the worker to stop at its next heartbeat (fslab stop, for another host)
  .claimed        the queued run was taken (to start it, or to stop it): one taker only (Run.claim);
                  a sweep's runs are held so until its record names them; names its holder, and a
                  holder gone from this host leaves the run free again (fslab.core.claims)
  metrics.jsonl   one JSON event per line, append-only
  stdout.log, stderr.log   the worker's output
  checkpoints/last.pt      the latest end-of-epoch checkpoint (atomic)
  results.json    final test accuracies (atomic)
  evaluations/    per-episode scores of each test evaluation (for paired comparisons)
  features/       split features cached by fslab eval (fslab.training.run_eval)
  slurm/          submitit's files and SLURM's logs, for a run sent to SLURM
  summary.json    what listings show, kept in step with the files above (fslab.core.summary)
  sink_failures.json   the run's sinks that failed as it trained, until exported to (fslab.core.sinks)
``runs/sweeps/<sweep>.json``  the runs of each sweep (fslab.core.sweeps)

Readers never trust a last line without its newline (it may still be written)
and skip lines that do not parse (fslab.core.files).
"""

from __future__ import annotations

import bisect
import difflib
import errno
import json
import os
import re
import shlex
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fslab.core.claims import (
    CLAIM_FILE,
    Holder,
    damaged_claim,
    damaged_claim_line,
    held_elsewhere_line,
    holder_gone,
    holder_line,
    read_claim,
    read_holder,
    take_stale,
)
from fslab.core.clocks import on_writer_clock
from fslab.core.creation import creation_key
from fslab.core.creation import newest_first as by_creation
from fslab.core.errors import ConfigError, FslabError, RunNotFound, UsageError
from fslab.core.events import kept_scores, other_precision
from fslab.core.files import (
    NAME_MAX,
    NEW_FILE_MODE,
    atomic_write_json,
    fitting_name,
    naming,
    overwrite,
    read_events,
    read_json,
)
from fslab.core.flocks import briefly_held
from fslab.core.schemas import evaluation, event, results
from fslab.core.schemas import status as status_of
from fslab.core.settings import project_above
from fslab.core.slurm_queue import job_alive, waits_for_job
from fslab.core.states import HOST, run_state
from fslab.core.worklock import is_held, observed_state

if TYPE_CHECKING:
    from fslab.core.config import RunConfig

# The configuration module (and secrets, shutil) are imported where they are
# used: listing runs reads no configuration, and `fslab runs` starts faster.

STATUS_LOCK = ".status.lock"  # held by each writer of status.json (Run.write_status)
CLOSE = 0.6  # how alike a mistyped id and a run id are before the run is suggested (difflib's ratio)
SWEEPS = "sweeps"  # runs/sweeps/: the sweep records (fslab.core.sweeps), not a run


def run_events(run_path: str | Path) -> list[dict]:
    """The events of the run folder's ``metrics.jsonl``, as every reader takes them: whole lines only (a
    last line without its newline is still being written), each a JSON object with the fields of its
    kind (:func:`fslab.core.schemas.event`; a damaged line is left out); none where there is no file."""
    return [e for e in read_events(Path(run_path) / "metrics.jsonl")[0] if event(e) is not None]


def _elsewhere(holder: Holder | None) -> bool:
    """Whether a claim's holder is one this machine cannot tell gone: another host's, or an older fslab's line
    that names no host (never a claim to submit a SLURM job, which may exist although its submitter is gone)."""
    return holder is not None and not holder.slurm and holder.pid is not None and holder.host != HOST


@dataclass(frozen=True)
class Run:
    path: Path

    @property
    def id(self) -> str:
        return self.path.name

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def checkpoint_path(self) -> Path:
        return self.path / "checkpoints" / "last.pt"

    @property
    def slurm_path(self) -> Path:
        """Where a SLURM job of the run keeps submitit's files and SLURM's logs."""
        return self.path / "slurm"

    def config(self) -> dict:
        """The run's configuration, migrated to the current version (so readers
        never need fallbacks for keys older fslabs did not write); ``{}`` while
        ``config.json`` is missing or unreadable."""
        from fslab.core.migrations import migrate

        saved = read_json(self.path / "config.json")
        if not saved:
            return {}
        try:
            return migrate(saved)
        except ConfigError as error:
            raise type(error)(f"run {self.id}: {error}") from None  # NewerConfig stays one

    def run_config(self) -> RunConfig:
        """The typed configuration, for code that starts or stops the run; a
        configuration that is missing or of the wrong shape is one line."""
        from fslab.core.config import run_config

        if read_json(self.path / "config.json") is None:
            raise ConfigError(f"run {self.id}: config.json is missing or not a JSON object")
        config = self.config()  # what it refuses already names the run
        try:
            return run_config(config)
        except ConfigError as error:
            raise type(error)(f"run {self.id}: config.json: {error}") from None

    def status(self) -> dict:
        """``status.json``, the values of the wrong type left out (:mod:`fslab.core.schemas`)."""
        return status_of(read_json(self.path / "status.json"))

    def results(self) -> dict | None:
        """``results.json`` when it holds test scores (:func:`fslab.core.schemas.results`)."""
        return results(read_json(self.path / "results.json"))

    def write_status(self, when: Callable[[dict], bool] | None = None, **fields: Any) -> dict:
        """Update ``status.json`` (write-then-rename), holding ``.status.lock``
        from the read to the rename: the worker's heartbeat, a stop, a SLURM
        submission recording its job id and the job itself each rewrite it, and
        none loses another's fields. ``when``, a test of the status as read under
        the lock: where it fails, nothing is written and that status is returned
        (a stop's ``killed`` written only if the worker has not recorded its own
        end meanwhile). On a full disk, where no new file can be made, it is
        rewritten in place instead: an end state recorded is worth more than the
        rename's guarantee."""
        path = self.path / "status.json"
        with briefly_held(self.path / STATUS_LOCK):
            current = self.status()
            if when is not None and not when(current):
                return current
            status = {**current, **fields}
            try:
                atomic_write_json(path, status)
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not path.exists():
                    raise
                overwrite(path, json.dumps(status, indent=2, sort_keys=True) + "\n")
        return status

    def state(self, status: dict | None = None, now: float | None = None, *, locked: bool | None = None) -> str:
        """The run's state (:func:`fslab.core.states.run_state`), its worker
        lock probed when that matters; a caller that holds the lock itself
        passes ``locked=False`` (no worker holds it, and no job can start one
        meanwhile). Either way, SLURM is asked about the job a queued run waits for."""
        status = self.status() if status is None else status
        if locked is None:
            return observed_state(self.path, status, now)
        now = on_writer_clock(self.path, status, now)
        return run_state(status, now, locked, job_alive(status, now) if waits_for_job(status) else None)

    def events(self) -> list[dict]:
        """The events of ``metrics.jsonl`` that have the fields of their kind."""
        return run_events(self.path)

    def events_of(self, kind: str) -> list[dict]:
        return [e for e in self.events() if e.get("event") == kind]

    def check_folder(self, nothing_to: str) -> None:
        """:class:`RunNotFound` where the run's folder is gone (deleted since it was listed, or since the
        dashboard read it): its own line, not that its status.json or lock file cannot be read."""
        if not self.path.is_dir():
            raise RunNotFound(f"run {self.id} was deleted (its folder {self.path} is gone); nothing to {nothing_to}")

    def check_writable(self, command: str, keeps: str, again: str) -> None:
        """FslabError where this process cannot write into the run's folder (a read-only copy of a store,
        another user's run), said before any work: why ``command`` writes there (it keeps ``keeps``), and
        to ``again`` a copy, where the system's error named the first file it failed on midway."""
        if not os.access(self.path, os.W_OK):
            raise FslabError(f"cannot write into {self.path}: {command} keeps {keeps} in the run's folder; "
                             f"{again} a copy in a store this user can write (cp -r {shlex.quote(str(self.path))} "
                             f"OTHER/runs/)")

    def claim(self, *, slurm: bool = False) -> bool:
        """Take this queued run for starting (or ending). Exactly one caller ever wins
        (``O_EXCL``), so two schedulers never start the same run. A claim whose holder
        is gone while the run still waits (:meth:`stale_claim`) is taken over, by one
        caller only (:func:`fslab.core.claims.take_stale`). ``slurm``: taken to submit a
        SLURM job, which may exist whatever becomes of this process (never stale)."""
        try:
            fd = os.open(self.path / CLAIM_FILE, os.O_CREAT | os.O_EXCL | os.O_WRONLY, NEW_FILE_MODE)
        except FileExistsError:
            return take_stale(self.path, self.waits, slurm) is not None
        except OSError:  # a folder this process cannot write to
            return False
        try:
            with open(fd, "w") as fh:
                fh.write(holder_line(slurm))
        except OSError as exc:  # a full disk: made, its line unwritten; empty, it would name no taker to judge
            (self.path / CLAIM_FILE).unlink(missing_ok=True)  # for good: nothing could take the run again
            raise naming(exc, self.path / CLAIM_FILE) from None
        return True

    def claim_for_slurm(self) -> None:
        """Mark this process's claim as taken to submit a SLURM job: the job may exist
        whatever becomes of this process, so the claim is never judged stale."""
        overwrite(self.path / CLAIM_FILE, holder_line(slurm=True))

    def unclaim(self) -> None:
        """Let go of a run this process claimed and has not started: schedulers may take it now."""
        (self.path / CLAIM_FILE).unlink(missing_ok=True)

    def claimed(self) -> bool:
        """Whether the run was ever taken for starting (an unreadable folder counts as taken)."""
        try:
            os.stat(self.path / CLAIM_FILE)
        except FileNotFoundError:
            return False
        except OSError:
            return True
        return True

    def waits(self, status: dict | None = None) -> bool:
        """Whether the run is queued and nothing runs it or will: no worker's pid in its status,
        no SLURM job, no process holding its worker lock (a launcher starting it)."""
        return unstarted(self.status() if status is None else status) and is_held(self.path) is not True

    def stale_claim(self, status: dict | None = None) -> Holder | None:
        """The holder of this run's claim where that claim is stale: the holder claimed on this
        host and is gone (:func:`fslab.core.claims.holder_gone`), and the run still :meth:`waits`.
        Such a run is free: :meth:`claim` takes it over. None otherwise (no claim, a live holder,
        another host's, a claim to submit a SLURM job, or an old file that names no host)."""
        holder = read_holder(self.path)
        if not holder_gone(holder) or not self.waits(status):
            return None
        return holder

    def held_elsewhere(self, status: dict | None = None) -> Holder | None:
        """The holder of this queued, unstarted run's claim where this machine cannot tell whether it
        is gone: it claimed on another host, or its claim (an older fslab's) names no host. For the
        line that says how to free the run by hand (remove ``.claimed``)."""
        holder = read_holder(self.path)
        if not _elsewhere(holder):
            return None
        return holder if unstarted(self.status() if status is None else status) else None

    def damaged_claim(self, status: dict | None = None) -> str | None:
        """What is wrong with the claim of this queued, unstarted run where it names no taker and never will
        (:func:`fslab.core.claims.damaged_claim`): no scheduler starts the run while the file is there."""
        if not unstarted(self.status() if status is None else status):
            return None
        return damaged_claim(self.path)

    def claim_problem(self, status: dict | None = None) -> str | None:
        """Why this queued run will not start unless a person acts, in the one line ``fslab queue`` (and its
        "problem" with --json), ``fslab runs``, ``fslab show``, ``fslab resume`` and the dashboard's run screen
        say: its claim file names no taker (:meth:`damaged_claim`), or a taker this machine cannot tell gone
        (:meth:`held_elsewhere`); else None. Only a queued run can have it: a caller listing runs asks only of
        those its summary says are queued, so the claim files of the ended ones are never read."""
        status = self.status() if status is None else status
        if status.get("state") != "queued" or not unstarted(status):
            return None
        holder, damaged = read_claim(self.path)  # the file read once: a dashboard's tick asks of every queued run
        if damaged is not None:
            return damaged_claim_line(self.path, damaged)
        return held_elsewhere_line(self.path, holder) if _elsewhere(holder) else None

    def lost_submission(self, status: dict | None = None, *, locked: bool | None = None) -> Holder | None:
        """The holder of this run's claim where it was taken to submit a SLURM job and the run still
        waits (queued, no worker's pid, no job id recorded, no launcher holding its lock; a caller
        holding that lock itself passes ``locked=False``): the submitting command was killed,
        perhaps after sbatch. Such a claim is never judged stale (a job may be queued), so only a
        person can free the run: :func:`fslab.core.claims.lost_submission_line` says how."""
        holder = read_holder(self.path)
        if holder is None or not holder.slurm:
            return None
        if not unstarted(self.status() if status is None else status):
            return None
        return holder if (is_held(self.path) if locked is None else locked) is not True else None

    def free(self) -> bool:
        """Whether no one holds the run: never claimed, or its claim is stale (:meth:`stale_claim`)."""
        return not self.claimed() or self.stale_claim() is not None

    def save_accuracies(self, result: dict, accuracies) -> Path:
        """Per-episode accuracies of one evaluation, in ``evaluations/``, named
        by everything that fixes its episodes (split, evaluator, shape, episode
        count, seed, checkpoint epoch), so runs can be compared episode by episode.
        Scores of other data than those the name holds (``fslab eval --data-root`` on
        images that differ) go beside them, ``..._data<fingerprint>.json``, never in their
        place: the training's own test scores stay what ``fslab runs`` shows, and readers
        take the plain name first (it sorts before the other). So do scores of the network
        run in another precision than the run's own (``fslab eval --precision``), named
        ``..._<precision>.json``, which readers leave out (:func:`other_precision`). A name
        that would pass a file name's 255 bytes (an evaluator's long parameters) is cut, with
        a hash of the whole (:func:`fslab.core.files.fitting_name`); readers go by the file's contents."""
        folder = self.path / "evaluations"
        folder.mkdir(exist_ok=True)
        name = fitting_name(safe_name(evaluation_key(result)), NAME_MAX - len("_data.json") - 16)  # long parameters
        path = folder / f"{name}.json"
        data = result.get("data")
        if isinstance(data, str) and _other_data(path, data):
            path = folder / f"{name}_data{safe_name(data[:16])}.json"
        atomic_write_json(path, {**result, "accuracies": kept_scores(accuracies)})
        return path

    def saved_accuracies(self) -> list[dict]:
        """Every evaluation saved by :meth:`save_accuracies` that can be used
        (:func:`fslab.core.schemas.evaluation`: files saved before the evaluator
        and the episode stream were recorded were the centroid evaluator's, on
        stream 1)."""
        return self.saved_evaluations()[0]

    def saved_evaluations(self) -> tuple[list[dict], list[str]]:
        """:meth:`saved_accuracies`, and the names of the files in ``evaluations/`` that cannot be
        used (not JSON, a score that is not a number from 0 to 1: NaN, Infinity, a percent; fewer
        scores than episodes), which readers name rather than leave out in silence."""
        try:
            names = sorted(e.name for e in os.scandir(self.path / "evaluations") if e.name.endswith(".json"))
        except OSError:
            return [], []
        found = [(name, evaluation(read_json(self.path / "evaluations" / name))) for name in names]
        return [record for _, record in found if record is not None], [name for name, record in found if record is None]


def evaluation_key(result: dict) -> str:
    """The name :meth:`Run.save_accuracies` gives the file of an evaluation ``result`` (before :func:`safe_name`
    and a cut to fit): everything that fixes its episodes, ``test-centroid-5way-1shot-15q-40ep-seed0-epoch2``,
    then ``_bf16`` for a network run in another precision than the run's; :func:`evaluation_named` reads it back."""
    key = (f"{result['split']}-{result['evaluator']}-{result['ways']}way-{result['shots']}shot-"
           f"{result['queries']}q-{result['episodes']}ep-seed{result['seed']}-epoch{result['epoch']}")
    return key + (f"_{result['precision']}" if other_precision(result) else "")


_EVALUATION_NAME = re.compile(r"(?P<split>[a-z]+)-(?P<evaluator>.+)-(?P<ways>\d+)way-(?P<shots>\d+)shot-"
                              r"(?P<queries>\d+)q-(?P<episodes>\d+)ep-seed(?P<seed>-?\d+)-epoch(?P<epoch>\d+)"
                              r"(?:_(?P<precision>fp32|bf16|fp16))?(?:_data[^.]*)?\.json")


def evaluation_named(name: str) -> dict | None:
    """What the name of a file in ``evaluations/`` says of its evaluation (:func:`evaluation_key` read back,
    ``_data...`` after it aside): its split, evaluator label, ways, shots, queries, episodes, seed and epoch,
    and the precision of its network where it is another than the run's own (else None); None for a name
    :meth:`Run.save_accuracies` did not give, or cut to fit (``~`` and a hash): what a damaged file held is
    read from its name alone."""
    found = _EVALUATION_NAME.fullmatch(name)
    if found is None:
        return None
    return {key: int(value) if key in ("ways", "shots", "queries", "episodes", "seed", "epoch") else value
            for key, value in found.groupdict().items()}


def _other_data(path: Path, data: str) -> bool:
    """Whether the evaluation saved at ``path`` was scored on data whose fingerprint is known and not ``data``."""
    saved = read_json(path)  # None where there is none, or none fslab can read: that is replaced
    held = saved.get("data") if saved is not None else None
    return isinstance(held, str) and held != data


def safe_name(text: str) -> str:
    """``text`` as a file name that stays in its folder: characters other than
    letters, digits and ``._-=,[]`` become ``_`` (an evaluator parameter such as
    ``../x`` or ``a/b`` cannot name a path elsewhere), and it never starts with a dot."""
    name = "".join(c if c.isalnum() or c in "._-=,[]" else "_" for c in text)
    return "_" + name if name.startswith(".") else name


def unstarted(status: dict) -> bool:
    """Whether a run's ``status`` says it is queued and nothing was started for it: no worker's pid, no SLURM job."""
    return status.get("state") == "queued" and not status.get("pid") and not status.get("slurm_job_id")


METHOD_IN_ID = 64  # the bytes of a method's name a run id holds: room left for the names built from an id


def new_run_id(method: str) -> str:
    """Date and time (this host's local time, as people read it: the order runs were made in is
    :mod:`fslab.core.creation`'s), the method's name (cut past :data:`METHOD_IN_ID` bytes, with a hash: a plugin's
    method may have a name of any length) and a random suffix."""
    import secrets

    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{fitting_name(safe_name(method), METHOD_IN_ID)}-{secrets.token_hex(2)}"


def create_run(runs_dir: Path, method: str, config: dict, *, claimed: bool = False,
               sweep: str | None = None, slurm: bool = False) -> Run:
    """A new run folder with its config and a ``queued`` status. ``mkdir`` is
    atomic, so two runs started in the same second never share a folder.
    ``claimed``: taken (:meth:`Run.claim`) before its status says queued, for a run its
    creator starts itself (``fslab run``), or holds until its sweep's record names it
    (:meth:`Run.unclaim`), which no scheduler of the project may start first.
    ``sweep``: the sweep it belongs to, in its first status already. ``slurm``: claimed to
    submit it as a SLURM job (a claim never judged stale: :meth:`Run.claim`)."""
    try:
        runs_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if runs_dir.exists() and not runs_dir.is_dir():  # made a file since the command (or the dashboard) began
            raise FslabError(f"cannot create the runs folder {runs_dir}: it is a file; move or rename it") from None
        raise FslabError(f"cannot create the runs folder {runs_dir}: {exc.strerror or exc}") from None
    for _ in range(100):
        path = runs_dir / new_run_id(method)
        try:
            path.mkdir()
        except FileExistsError:
            continue
        except OSError as exc:
            raise FslabError(f"cannot create a run folder in {runs_dir}: {exc.strerror or exc}") from None
        try:
            (path / "checkpoints").mkdir()
            if claimed:
                Run(path).claim(slurm=slurm)
            atomic_write_json(path / "config.json", config)
            Run(path).write_status(state="queued", host=HOST, created=time.time(),
                                   **({"sweep": sweep} if sweep else {}))
        except BaseException as exc:  # a full disk, or Ctrl-C: no half-made run is left behind
            import shutil

            shutil.rmtree(path, ignore_errors=True)
            if isinstance(exc, OSError):
                raise FslabError(f"cannot write the new run folder {path}: {exc.strerror or exc}") from None
            raise
        return Run(path)
    raise FslabError(f"could not create a new run folder in {runs_dir}")


def run_names(runs_dir: Path) -> list[str]:
    """The names of the folders in ``runs_dir`` that may be runs (not hidden,
    not the sweep records), sorted by name, so by the local time each id begins
    with; no file is read (:func:`newest_first` puts them in the order they were made)."""
    try:
        entries = list(os.scandir(runs_dir))
    except OSError:
        return []
    return sorted(e.name for e in entries if not e.name.startswith(".") and e.name != SWEEPS and _is_dir(e))


def run_paths(runs_dir: Path) -> list[Path]:
    """Every run folder, in the order of their names (:func:`run_names`): as listings count them
    (:attr:`fslab.core.summary.SummaryFile.is_run`), a folder with its ``config.json`` or its ``status.json`` (one
    whose config.json is gone is still a run, unreadable: ``fslab runs`` lists it, and ``all`` and ``last`` name
    it, where fslab compare and fslab show say why)."""
    return [Path(runs_dir) / name for name in run_names(runs_dir)
            if _config_of(runs_dir, name) is not False or _config_of(runs_dir, name, "status.json") is not False]


def _config_of(runs_dir: Path, name: str, file: str = "config.json") -> bool | None:
    """True if the folder has a config.json (or ``file``), False if it has none, None
    if it cannot be told (a folder this user may not read: still a run, unreadable)."""
    try:
        os.stat(os.path.join(runs_dir, name, file))
    except FileNotFoundError:
        return False
    except OSError:
        return None
    return True


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def list_runs(runs_dir: Path) -> list[Run]:
    """Every run, oldest first (:func:`in_creation_order`)."""
    return [Run(Path(runs_dir) / name) for name in in_creation_order(runs_dir, [p.name for p in run_paths(runs_dir)])]


def in_creation_order(runs_dir: Path, names: list[str]) -> list[str]:
    """Run folder names oldest first, in the one order of every listing, the dashboard's and ``last``: the
    time each was created (:mod:`fslab.core.creation`), which ids, stamped in their host's local time,
    need not follow across time zones or a DST fall-back."""
    return list(reversed(list(newest_first(runs_dir, sorted(names)))))


def newest_first(runs_dir: Path, names: list[str],
                 created_of: Callable[[str], float | None] | None = None) -> Iterator[str]:
    """``names`` (sorted, as :func:`run_names` gives them) in the reverse of :func:`in_creation_order`,
    reading each run's creation time (its status's, or ``created_of``'s) only once the walk from the newest
    id reaches it (:func:`fslab.core.creation.newest_first`): the newest 50 of a store cost the reads of
    the runs stamped within about a day of them."""
    if created_of is None:
        created_of = lambda name: _created(Run(Path(runs_dir) / name))
    return by_creation(names, created_of)


def find_run(runs_dir: Path, ref: str, *, whole: bool = False) -> Run:
    """A run by id, unique id prefix, unique substring, ``last`` (the newest), or the path of its
    folder (or of a file in it, unless ``whole``: fslab delete, where a file's path would delete the run
    it is in), as the shell completes one: ``runs/<id>/``.
    Folder names are compared, and no file is read, so a store of any size answers at once."""
    if not ref.strip():
        raise RunNotFound("an empty run id names no run; give a run id, a unique part of one, or 'last'")
    ref = as_id(ref)
    if ref != "last":  # unreadable runs can be named too: fslab show says why they cannot be read
        names = [path.name for path in run_paths(runs_dir)]
        return _match(runs_dir, _named_by_path(runs_dir, ref, names, whole) if is_path(ref) else ref, names)
    newest = next(newest_first(runs_dir, [path.name for path in run_paths(runs_dir)]), None)
    if newest is None:
        raise RunNotFound(f"no runs yet: {runs_dir}/ holds none; start one with: fslab run nca{project_above()}")
    return Run(Path(runs_dir) / newest)  # the one created last (fslab.core.creation)


def as_id(ref: str) -> str:
    """``ref`` without the ``/`` a shell's completion leaves after a folder's name, where that is all the path
    there is and no such folder is here (``2e05/``, completed in the store and run from the project): a
    part of an id, as a path it names nothing. Anything else as given."""
    bare = ref.rstrip("/")
    return bare if bare and bare != ref and "/" not in bare and not os.path.lexists(ref) else ref


def is_path(ref: str) -> bool:
    """Whether a RUN or SWEEP given is a path (no run or sweep id holds a / or is a dot)."""
    return "/" in ref or ref in (".", "..")


def _named_by_path(runs_dir: Path, ref: str, names: list[str], whole: bool = False) -> str:
    """The id of the run whose folder holds the path ``ref`` (no run id holds a ``/``): its folder
    inside this store, whole; a path elsewhere, or to no run's folder here, is a RunNotFound, and so,
    where ``whole``, is a path inside a run's folder."""
    store, where = Path(runs_dir).resolve(), Path(os.path.expanduser(ref)).resolve()
    if where == store or store not in where.parents:
        other = next((p for p in (where, *list(where.parents)[:2])  # a run's folder, or a file or folder in it
                      if (p / "config.json").is_file() and (p / "status.json").is_file()), None)
        raise RunNotFound(f"'{ref}' belongs to a run of another store ({other.parent}/), not of this project's "
                          f"({runs_dir}/): run fslab in that run's project folder" if other else
                          f"'{ref}' is no run's folder in this project's store ({runs_dir}/); give a run's id, "
                          f"or its folder there: {runs_dir}/<id>")
    name, *inside = where.relative_to(store).parts
    if name == SWEEPS:  # the records' folder (a record's own path names its sweep before this)
        raise RunNotFound(f"{Path(runs_dir) / SWEEPS}/ holds the sweeps' records, not a run: give a run's id, or where "
                          f"a sweep is taken its id or its record's path, {Path(runs_dir) / SWEEPS}/<id>.json (list "
                          f"them with: fslab runs)")
    if name not in names:
        raise RunNotFound(f"no run folder {Path(runs_dir) / name} (a path names a run's folder whole; a part of "
                          f"an id goes without the path).{closest_ids(name, names)} List them with: fslab runs")
    if whole and inside:
        raise UsageError(f"'{ref}' is inside run {name}'s folder, and this command takes whole runs: give the run's "
                         f"id or its folder, {Path(runs_dir) / name}")
    return name


def _match(runs_dir: Path, ref: str, names: list[str]) -> Run:
    found = matching_names(ref, names)
    if len(found) == 1:
        return Run(Path(runs_dir) / found[0])
    if len(found) > 1:
        shown = ", ".join(found[:5])
        raise RunNotFound(f"'{ref}' matches {len(found)} runs ({shown}{', ...' if len(found) > 5 else ''}); "
                          f"give more of the id")
    sweeps = sweeps_named(runs_dir, ref)
    if len(sweeps) == 1:  # where a SWEEP is taken, it names the sweep (fslab.core.sweeps.names_sweep)
        raise RunNotFound(f"'{ref}' names no run but sweep {sweeps[0]}, and this command takes one run; "
                          f"list the sweep's runs with: fslab runs --sweep {sweeps[0]}")
    if sweeps:
        raise RunNotFound(f"'{ref}' names no run but {len(sweeps)} sweeps ({', '.join(sweeps[:5])}"
                          f"{', ...' if len(sweeps) > 5 else ''}), and this command "
                          f"takes one run; list a sweep's runs with: fslab runs --sweep SWEEP")
    if not names and (above := project_above()):  # run in a project's subfolder, whose runs/ holds none
        raise RunNotFound(f"no run '{ref}' in {runs_dir}, which holds none{above}")
    meant = " Did you mean 'last' (the newest run)?" if ref.strip().lower() == "last" else closest_ids(ref, names)
    raise RunNotFound(f"no run '{ref}' in {runs_dir}.{meant} List them with: fslab runs")


def closest_ids(ref: str, names: list[str], most: int = 3) -> str:
    """`` Did you mean 'ID'?`` naming the run ids closest to ``ref``, a mistyped id (the closest, and up to
    ``most`` as close), or ''. Each id is compared whole, and by its end and its start at ``ref``'s length, as
    parts of ids are given: a table's short id with a typo, ``2e06`` for the run that ends ``2e05``. A start
    counts only from the date and time on (15 characters): a shorter one matches every run of that day."""
    def closeness(name: str) -> float:
        parts = (name, name[-len(ref):], *([name[:len(ref)]] if len(ref) >= 15 else []))
        matchers = [difflib.SequenceMatcher(None, ref, part) for part in parts]
        return max((m.ratio() for m in matchers if m.quick_ratio() >= CLOSE), default=0.0)  # quick: 10,000 runs

    scored = sorted(((score, name) for name in names if ref and (score := closeness(name)) >= CLOSE),
                    key=lambda scored: -scored[0])
    close = [f"'{name}'" for score, name in scored[:most] if score >= scored[0][0] - 0.05]
    if len(close) > 1:
        return f" Did you mean {', '.join(close[:-1])} or {close[-1]}?"
    return f" Did you mean {close[0]}?" if close else ""


def sweeps_named(runs_dir: Path, ref: str) -> list[str]:
    """The ids of the sweeps whose id is ``ref`` or holds it (their records'
    names: no file is read)."""
    try:
        names = sorted(name[:-5] for name in os.listdir(Path(runs_dir) / SWEEPS)
                       if name.startswith("sweep-") and name.endswith(".json"))
    except OSError:
        return []
    return [name for name in names if name == ref] or [name for name in names if ref in name]


def matching_names(ref: str, names: list[str]) -> list[str]:
    """The run names ``ref`` names, by the first rule that matches any: the
    whole id, a prefix of ids, a part of ids (:func:`find_run`)."""
    for matcher in (lambda n: n == ref, lambda n: n.startswith(ref), lambda n: ref in n):
        found = [n for n in names if matcher(n)]
        if found:
            return found
    return []


def short_ids(runs_dir: Path, ids: list[str], shortest: int = 4) -> dict[str, str]:
    """For each of ``ids``, the shortest end of it (at least ``shortest``
    characters: the random suffix, like a short git hash) that
    :func:`find_run` resolves to that run alone among every run in the store;
    tables show these where the whole id does not fit. Counting in one joined
    string keeps a store of 10,000 runs fast; for many ids (fslab runs --all),
    the names are indexed instead (:class:`_Occurrences`): a scan of the joined
    string per end grew as ids times runs, 4 s for --all over 10,000 runs."""
    names = run_names(runs_dir)
    every, blob = set(names), "\n" + "\n".join(names)
    if len(ids) > SHORT_IDS_SCAN_UP_TO and blob.count("\n") == len(names):  # no name holds a newline
        index = _Occurrences(names, shortest)
        starting, occurrences = index.starting, index.count
    else:
        starting, occurrences = (lambda end: blob.count("\n" + end)), blob.count
    short = {}
    for run_id in ids:
        short[run_id] = run_id
        for size in range(shortest, len(run_id)):
            end = run_id[-size:]
            if end[0] in "-_" or end in every:
                continue
            starts = starting(end)
            if (starts == 0 and occurrences(end) == 1) or (starts == 1 and run_id.startswith(end)):
                short[run_id] = end
                break
    return short


SHORT_IDS_SCAN_UP_TO = 200  # ids that short_ids counts by scanning the joined names; more build an index


class _Occurrences:
    """What :func:`short_ids` counts in the joined names (sorted, none with a newline), for a ``text`` of
    at least ``size`` characters and no newline: the names starting with it, found by bisection, and its
    occurrences, in the names that hold its rarest piece of ``size`` characters (an index of their pieces)."""

    def __init__(self, names: list[str], size: int) -> None:
        self.names, self.size = names, size
        self.holding: dict[str, list[int]] = {}
        for number, name in enumerate(names):
            for piece in {name[i:i + size] for i in range(len(name) - size + 1)}:
                self.holding.setdefault(piece, []).append(number)

    def starting(self, text: str) -> int:
        at = first = bisect.bisect_left(self.names, text)
        while at < len(self.names) and self.names[at].startswith(text):
            at += 1
        return at - first

    def count(self, text: str) -> int:
        # a text without a newline occurs within one name, which holds each of its pieces: the joined
        # string's count is the sum over the names holding its rarest piece
        holding = min((self.holding.get(text[i:i + self.size], ()) for i in range(len(text) - self.size + 1)),
                      key=len)
        return sum(self.names[n].count(text) for n in holding)


def creation_order(run: Run) -> tuple:
    """A key that sorts runs oldest first, in the order of every listing (:mod:`fslab.core.creation`)."""
    return creation_key(run.id, _created(run))


def start_order(status: dict, run_id: str) -> tuple:
    """A key that sorts queued runs in the order a scheduler starts them: the
    time each was queued (its creation, or its requeue by ``fslab sweep
    resume``, which leaves ``created`` as it was), then the id."""
    queued = status.get("requeued") or status.get("created")
    return float(queued) if isinstance(queued, (int, float)) else 0.0, run_id


def _created(run: Run) -> float | None:
    """The run's recorded creation time, read alone (:func:`fslab.core.creation.creation_key` checks it): a
    listing reads it for each run stamped within about a day of those it lists."""
    status = read_json(run.path / "status.json")
    return status.get("created") if status is not None else None
