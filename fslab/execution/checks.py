"""What is checked before a run is created, started or resumed, so that a
mistake is one line at the prompt rather than a run that fails later.

The same checks serve ``fslab run``, ``fslab sweep``, ``fslab resume`` and the
dashboard (all through :mod:`fslab.execution.executor`): :func:`check_run`
takes a resolved configuration through all of them. None imports torch or
decodes an image.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys

from fslab.core.claims import CLAIM_FILE, UNWRITTEN_GRACE_S, lost_submission_line, read_holder
from fslab.core.commands import like_command
from fslab.core.errors import UsageError
from fslab.core.keys import PLUGIN_SECTIONS
from fslab.core.plugin_params import check_plugins
from fslab.core.registry import create_dataset
from fslab.core.rerun import check_checkpoint_whole, stopped_when
from fslab.core.runstore import Run, unstarted
from fslab.core.settings import SlurmSettings
from fslab.core.split_sizes import check_evaluation, check_training, read_split_sizes
from fslab.core.states import RESUMABLE, UNREADABLE, unknown_state
from fslab.core.text import count
from fslab.core.types import SplitSizes, evaluator_traits
from fslab.execution.handover import refuse_if_live
from fslab.execution.slots import visible_gpus


def check_run(config: dict, registry, slurm: SlurmSettings | None = None, *,
              sizes_seen: dict | None = None, again: str | None = None, move: str | None = None) -> None:
    """Everything about a resolved configuration that can be known before
    its run exists: the device and GPUs it asks for (here, or in a SLURM
    job), the dataset's files, and the episodes and batches against the
    dataset's split sizes (each plugin's ``check`` again, now with the sizes).
    ``sizes_seen`` keeps the sizes of datasets already looked at (a sweep).
    ``again``: for a resume, the command that starts the run anew
    (``fslab run --like RUN``), which what this machine lacks is said with,
    since ``fslab resume`` takes no other settings; ``move``: for a resume, the command that resumes the run on
    the data it started on where that lies elsewhere (``fslab resume RUN --data-root DIR``, or fslab sweep
    resume's), which the lines of a data change name (:func:`data_changed`, :func:`for_resume`)."""
    check_targets(config, registry)
    if slurm is None:
        check_device(config, again)
        check_processes(config, again)
    else:
        if slurm.cluster == "local":
            check_device(config, again)
        check_job_processes(config, slurm, again)
    check_split_and_cpus(config, slurm, again)
    check_compile(config, slurm, again)
    try:
        sizes = dataset_sizes(config, registry, {} if sizes_seen is None else sizes_seen)
    except UsageError as exc:
        raise for_resume(exc, again, move) from None
    if not sizes:
        return
    try:
        check_training(config, sizes)
        check_evaluation(config, sizes, evaluator_shape(config, registry))
    except UsageError as exc:
        raise data_changed(exc, again, move) from None
    try:
        check_plugins(config, registry, sizes)
    except UsageError as exc:
        raise for_resume(exc, again) from None


def check_targets(config: dict, registry) -> None:
    """Each component the run trains with (its sections') whose lazy target names a module or an attribute
    that is nowhere (:meth:`fslab.core.registry.Component.check_target`): the plugin's line the worker failed
    with, once the run's folder was made, said before anything is created. Its sinks are not: one that cannot
    be imported never fails a run, which goes on without it (:mod:`fslab.core.sinks`)."""
    for section in PLUGIN_SECTIONS:
        registry.get(section, config[section]["name"]).check_target()


def for_resume(exc: UsageError, again: str | None, move: str | None = None) -> UsageError:
    """``exc`` as a resume says it (``again`` given): a dataset's or plugin's line that suggests
    ``--set`` (a ``dataset.cache_dir`` that cannot be written, say) is told that ``fslab resume``
    takes no --set (its --data-root only moves the run onto the data it started on), and which command
    starts the run anew with them; a dataset's line that says to give --data-root (its splits one folder
    down, say), the resume that takes it (``move``, its ``DIR`` the folder the line names, where it names
    one), [data_roots] being read by no resume; ``exc`` itself otherwise."""
    if again is not None and move and "--data-root " in str(exc) and "--set " not in str(exc):
        if named := re.search(r"give --data-root (.+?) \(or \[data_roots\]", str(exc)):
            move = move.replace("DIR", shlex.quote(named.group(1)))
        return UsageError(f"{exc} (a resume reads no [data_roots]: where the data the run started on lies "
                          f"elsewhere now, resume it there: {move})")
    if again is None or "--set " not in str(exc):
        return exc
    return UsageError(f"{exc} (fslab resume takes no --set: put right what the run's own settings need and "
                      f"resume it, or start it anew with other settings: {again} --set ...)")


def data_changed(exc: UsageError, again: str | None, move: str | None = None) -> UsageError:
    """``exc``, a split too small for the run's episodes or training, as a resume says it (``again`` given): the
    run's settings passed the same check when it was created, so the files of its data root changed since, and
    the line's advice to change a setting is one fslab resume cannot take (it takes no --set); where the data
    it started on lies elsewhere, ``move`` (``fslab resume ID --data-root DIR``, or fslab sweep resume's) resumes it
    there; ``exc`` itself otherwise."""
    if again is None:
        return exc
    there = f", or where they lie elsewhere now resume it there: {move}" if move else ""
    return UsageError(f"{exc} (the run's settings passed this check when it was created: files of its data root "
                      f"were removed or moved since; fslab resume takes no --set: put them back and resume it{there}, "
                      f"or start it anew with settings the data allows: {again} --set ...)")


def check_dataset(config: dict, registry):
    """Build the run's dataset once here when it registered ``check_early=True``:
    its constructor only checks its parameters and looks for its files, so a
    wrong root, a missing file or impossible sizes are one line now, not a
    failed run. Lazy targets are left to the worker (importing them could pull
    in torch). Returns the dataset built, or None."""
    component = registry.get("dataset", config["dataset"]["name"])
    if component.info.get("check_early") and not isinstance(component.target, str):
        return component.built(lambda: create_dataset(registry, config))
    check_data_root(config["dataset"], registry)
    return None


def check_data_root(dataset: dict, registry) -> None:
    """The data root of a dataset that reads files (:meth:`fslab.core.registry.Registry.reads_files`) and is
    not built here (no ``check_early``, or a lazy target): it must be a folder. One that is missing or a file
    was found by the dataset's constructor in the worker, once the run's folder was made (exit code 1)."""
    name, root = dataset["name"], dataset.get("root")
    if not registry.reads_files(name) or (isinstance(root, str) and os.path.isdir(root)):
        return
    what = ("is not given" if not isinstance(root, str) or not root else
            f"{root} does not exist" if not os.path.lexists(root) else f"{root} is not a folder")
    raise UsageError(f"dataset '{name}' reads its files from a folder, and its data root {what}; give the folder "
                     f"with --data-root DIR or [data_roots] {name} in fslab.toml")


def dataset_sizes(config: dict, registry, seen: dict) -> dict[str, SplitSizes] | None:
    """The split sizes the run's dataset tells (None if it tells none), built
    once per dataset section in ``seen``."""
    key = repr(sorted(config["dataset"].items()))
    if key not in seen:
        dataset = check_dataset(config, registry)
        seen[key] = None if dataset is None else read_split_sizes(dataset, config["dataset"]["name"])
    return seen[key]


def evaluator_shape(config: dict, registry) -> tuple[int, int] | None:
    """The episode shape the run's evaluator imposes (``episode_shape``), read
    from the evaluator itself when building it is cheap (not a lazy target)."""
    section = config["evaluator"]
    component = registry.get("evaluator", section["name"])
    if isinstance(component.target, str):
        return None
    evaluator = component.built(lambda: registry.create(
        "evaluator", section["name"], **{k: v for k, v in section.items() if k != "name"}))
    return evaluator_traits(evaluator).episode_shape


def check_compile(config: dict, slurm: SlurmSettings | None, again: str | None = None) -> None:
    """``train.compile`` on the CPU here needs the C++ compiler torch.compile
    runs there (:func:`cpu_compiler`), a job of ``[slurm] cluster = "local"`` too, since it
    runs here (as :func:`check_device` has it); a GPU run or a cluster's job is left to its machine."""
    if config["train"]["compile"] == "off" or (slurm is not None and slurm.cluster != "local"):
        return
    on_cpu = config["device"] == "cpu" or (config["device"] == "auto" and not visible_gpus())
    compiler, found = cpu_compiler()
    if on_cpu and not found:
        named = f"$CXX ({compiler!r})" if "CXX" in os.environ else compiler
        raise UsageError(f"train.compile={config['train']['compile']} on the CPU needs a C++ compiler, and "
                         f"{named}, the one torch.compile runs, is not found here; install it, set $CXX to one "
                         f"that is, or " + ("--set train.compile=off" if again is None else
                                            f"start the run again without compiling: {again} --set train.compile=off"))


def cpu_compiler() -> tuple[str, bool]:
    """The C++ compiler torch.compile runs on the CPU, as ``torch._inductor.config.cpp.cxx``
    chooses it (``$CXX`` where it is set, even empty, else g++, clang++ on macOS; a command
    with arguments, ``ccache g++``, is split as a shell would), and whether it is found."""
    compiler = os.environ.get("CXX", "clang++" if sys.platform == "darwin" else "g++")
    try:
        command = shlex.split(compiler)
    except ValueError:  # an unclosed quote: torch cannot run it either
        return compiler, False
    return compiler, bool(command) and shutil.which(command[0]) is not None


def check_device(config: dict, again: str | None = None) -> None:
    """A UsageError for a CUDA device this machine does not have (``cuda:N``
    needs N + 1 visible GPUs), without importing torch. ``--gpus N`` runs
    are checked by :func:`check_processes`."""
    device = config["device"]
    if not device.startswith("cuda") or config["train"]["processes"] > 1:
        return
    have = len(visible_gpus())
    index = int(device.partition(":")[2] or 0)
    if have == 0:
        fix = ("use --device cpu, or --device auto" if again is None else
               f"resume it where one is, or start it again on the CPU: {again} --device cpu")
        raise UsageError(f"device '{device}' needs a CUDA GPU, but none is visible here "
                         f"(CUDA_VISIBLE_DEVICES, nvidia-smi); {fix}")
    if index >= have:
        raise UsageError(f"device '{device}' needs {index + 1} visible GPUs, but {have} {'is' if have == 1 else 'are'} "
                         f"visible here; " + (f"use --device cuda:0{f' to cuda:{have - 1}' if have > 1 else ''}, "
                                              if again is None else f"start it again with {again} --device cuda:0, ")
                         + "or choose GPUs with CUDA_VISIBLE_DEVICES")


def check_processes(config: dict, again: str | None = None) -> None:
    """A UsageError unless this machine can run ``train.processes`` (--gpus):
    as many visible GPUs, or with device cpu, CPU processes (:func:`check_cpu_processes` bounds them)."""
    processes, device = config["train"]["processes"], config["device"]
    if processes == 1 or device == "cpu":
        return
    if device not in ("auto", "cuda"):
        raise UsageError(
            f"--gpus {processes} (train.processes) trains on the first {processes} visible GPUs, but device is "
            f"'{device}'; use --device cuda (or auto) and choose GPUs with CUDA_VISIBLE_DEVICES"
        )
    have = len(visible_gpus())
    if have < processes:
        # device cuda on a machine without a GPU: one process of it would be refused in turn, so the CPU is named
        fewer = "--device cpu --gpus 1" if have == 0 and device == "cuda" else f"--gpus {max(have, 1)}"
        cpu = min(processes, cpu_processes_allowed())  # the gloo processes this machine's CPUs allow
        fix = (f"use {fewer}, or --device cpu --gpus {cpu} for {cpu} gloo processes on the CPU (slow; for testing"
               f"{'' if cpu == processes else ', one per CPU at most'})" if again is None else
               f"resume it where {processes} are, or start it again on fewer: {again} {fewer}")
        raise UsageError(f"--gpus {processes} (train.processes) needs {processes} GPUs but {have} "
                         f"{'is' if have == 1 else 'are'} visible here; {fix}")


def check_batch_split(config: dict) -> None:
    """``--gpus N`` splits every batch's rows over the N processes: each needs one row at least."""
    processes, rows = config["train"]["processes"], config["train"]["batch_size"]
    if processes > rows:
        raise UsageError(f"--gpus {processes} (train.processes) splits each batch of {rows} rows (train.batch_size) "
                         f"over {processes} processes, one row each at least; use a batch of at least {processes} "
                         f"rows or --gpus {rows} at most")


# CPU (gloo) processes a --device cpu --gpus N run may start: one per CPU, and 2 wherever there are
# fewer, so the several-process path can be tried on any machine.
CPU_PROCESSES_ALWAYS = 2


def cpu_count() -> int:
    """The CPUs this process may run on (its affinity, which a container, taskset or SLURM narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - a system without affinities (macOS)
        return os.cpu_count() or 1


def cpu_processes_allowed() -> int:
    """The gloo processes a ``--device cpu`` run of this machine may start: one per CPU, 2 at least."""
    return max(cpu_count(), CPU_PROCESSES_ALWAYS)


def check_split_and_cpus(config: dict, slurm: SlurmSettings | None, again: str | None = None) -> None:
    """``--gpus N`` against the batch's rows (:func:`check_batch_split`) and, on the CPU, the CPUs
    (:func:`check_cpu_processes`): the tighter bound said first, so that the ``--gpus`` it suggests the other
    takes (``--device cpu --gpus 500`` and a batch of 128 on 2 CPUs was told ``--gpus 128 at most``, which the
    CPU check then refused)."""
    cpus, batch = (lambda: check_cpu_processes(config, slurm, again)), (lambda: check_batch_split(config))
    cpus_tighter = config["device"] == "cpu" and config["train"]["batch_size"] > _cpus(slurm)[0]
    for check in (cpus, batch) if cpus_tighter else (batch, cpus):
        check()


def _cpus(slurm: SlurmSettings | None) -> tuple[int, int, str]:
    """The gloo processes a ``--device cpu`` run may start where it runs (one per CPU, 2 at least), the CPUs
    there, and where that is: this machine, or a SLURM job of ``cpus_per_task``."""
    if slurm is not None and slurm.cluster != "local":
        have, where = slurm.cpus_per_task, "a SLURM job has (cpus_per_task)"
    else:
        have, where = cpu_count(), "this machine lets fslab use"
    return max(have, CPU_PROCESSES_ALWAYS), have, where


def check_cpu_processes(config: dict, slurm: SlurmSettings | None, again: str | None = None) -> None:
    """``--device cpu --gpus N`` starts N gloo processes: no more than the CPUs they run on (this machine's,
    or a SLURM job's ``cpus_per_task``), where 500 on a 2-core machine were started, each sharing a slice
    of a core, the machine swamped for a run no faster than one process's."""
    processes = config["train"]["processes"]
    if processes == 1 or config["device"] != "cpu":
        return
    most, have, where = _cpus(slurm)
    job = slurm is not None and slurm.cluster != "local"
    more = f", or give the job more: --slurm cpus_per_task={processes}" if job else ""
    if processes > most:
        fix = f"use --gpus {most} or fewer" if again is None else f"start it again on fewer: {again} --gpus {most}"
        raise UsageError(f"--device cpu --gpus {processes} (train.processes) starts {processes} gloo processes, "
                         f"more than the {count(have, 'CPU')} {where}; {fix}{more}")


def check_job_processes(config: dict, options: SlurmSettings, again: str | None = None) -> None:
    """``--gpus N`` in a job runs torchrun on the job's node, so SLURM must
    give the job N GPUs (``gpus_per_job``); with the local executor, this
    machine must have them. CPU (gloo) processes need no GPU."""
    processes = config["train"]["processes"]
    if processes == 1 or config["device"] == "cpu":
        return
    if options.cluster == "local":
        check_processes(config, again)
    elif options.gpus_per_job < processes:
        raise UsageError(f"--gpus {processes} (train.processes) in a SLURM job needs gpus_per_job >= {processes}, got "
                         f"{options.gpus_per_job}; pass --slurm gpus_per_job={processes} or set it in [slurm] "
                         f"of fslab.toml")


def _held_how(run: Run, status: dict) -> str:
    """What ``fslab resume`` of a queued run adds about a claim file that holds no line yet (its taker may be
    writing it; left so for :data:`fslab.core.claims.UNWRITTEN_GRACE_S` it is stale and the run started); else
    nothing. A claim that will hold the run until a person acts is :meth:`Run.claim_problem`'s line instead."""
    if (claim := read_holder(run.path)) is not None and claim.pid is None and unstarted(status):
        return (f"; its claim, {run.path / CLAIM_FILE}, names no taker yet (left empty by one killed before it "
                f"wrote it, or being written; taken over once {UNWRITTEN_GRACE_S:g} s old): if no fslab command is "
                f"starting the run, remove the file and run fslab resume {run.id} again")
    return ""


def check_resumable(run: Run, *, observed: bool = False) -> None:
    """A run can resume if it stopped (killed, lost or failed) after at least
    one checkpoint; otherwise say why not. Called holding the run's lock
    (:func:`fslab.execution.handover.launch_lock`), so no worker holds it; or,
    ``observed``, by a caller that does not hold it (the dashboard, before it
    asks), so its state is observed, its lock probed: a live worker is refused
    as the launch under the lock would refuse it."""
    run.check_folder("resume")
    status = run.status()
    state = run.state(status) if observed else run.state(status, locked=False)
    refuse_if_live(run, state, status)
    if state in RESUMABLE and not run.config():
        raise UsageError(f"run {run.id} cannot resume: its config.json is missing or unreadable (fslab runs lists "
                         f"it as unreadable); put the file back from a copy of the run, then resume it")
    if state == UNREADABLE and (unknown := unknown_state(status)):
        raise UsageError(f"run {run.id} cannot resume: its {unknown}; put back a status.json this fslab writes, "
                         f"or resume it with the fslab that wrote it")
    if state == UNREADABLE:  # its status.json: how it ended cannot be told (a copy made while it was written)
        raise UsageError(f"run {run.id} is unreadable: its status.json is missing or cannot be read (fslab show "
                         f"{run.id} says why), so how it ended cannot be told; put the file back from a copy of "
                         f"the run, then resume it")
    if state not in RESUMABLE:
        again = ("" if state != "completed" else f"; to train a run like it from the start: {like_command(run.id)}"
                 if run.config() else "; nor can a run like it start while its config.json is missing or unreadable "
                 "(fslab runs lists it as unreadable): put the file back from a copy of the run")
        if state == "queued" and (problem := run.claim_problem(status)) is not None:
            raise UsageError(problem)  # damaged, or held by a taker this machine cannot tell gone: as fslab queue
        if state == "queued":
            again = _held_how(run, status)
        lost = run.lost_submission(status, locked=None if observed else False) if state == "queued" else None
        if lost is not None:
            raise UsageError(lost_submission_line([run.id], [lost], f"fslab resume {run.id}"))
        raise UsageError(f"run {run.id} is {state}; only killed, lost or failed runs can resume{again}")
    if not run.checkpoint_path.exists():
        raise UsageError(
            f"run {run.id} has no checkpoint (it stopped {stopped_when(run)}); "
            f"start it again with the same settings: {like_command(run.id)}"
        )
    check_checkpoint_whole(run, "resume")
