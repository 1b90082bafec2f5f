"""The training loop: build everything from the registry, train, evaluate, save.

Reads top to bottom: setup, the epoch loop (one logged event per interval, a
validation evaluation and a checkpoint per epoch), the final test evaluation,
``results.json``. Started by :mod:`fslab.execution.worker` inside a run folder.
"""

from __future__ import annotations

import math
import os
import random
import time

import torch

from fslab.training import distributed

from fslab.training import evaluation
from fslab.core.eventlog import EventLog, truncate_to_checkpoint
from fslab.core.events import evaluator_label
from fslab.training.features import feature_network
from fslab.core.registry import create_dataset, load_registry
from fslab.core.files import atomic_write_json
from fslab.core.runstore import Run
from fslab.core.settings import load_settings


def plugin_kwargs(section: dict) -> dict:
    """A plugin section's parameters: every key but ``name``."""
    return {k: v for k, v in section.items() if k != "name"}


def make_optimizer(params, tcfg: dict) -> torch.optim.Optimizer:
    """``train.optimizer``: SGD with (Nesterov) momentum, or Adam with its
    default betas; both with ``train.lr`` and ``train.weight_decay`` (L2).
    Configurations saved before the key existed trained with SGD."""
    name = tcfg.get("optimizer", "sgd")
    if name == "adam":
        return torch.optim.Adam(params, lr=tcfg["lr"], weight_decay=tcfg["weight_decay"])
    if name == "sgd":
        return torch.optim.SGD(params, lr=tcfg["lr"], momentum=tcfg["momentum"],
                               nesterov=tcfg["nesterov"], weight_decay=tcfg["weight_decay"])
    raise ValueError(f"train.optimizer must be sgd or adam, got '{name}'")  # config.resolve rejects it first


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device '{name}' was asked for but CUDA is not available here; use --device cpu")
    return torch.device(name)


def to_input(images: torch.Tensor) -> torch.Tensor:
    """uint8 [B, C, H, W] on the device -> float in [-1, 1]."""
    return images.float().div_(127.5).sub_(1.0)


def augment(x: torch.Tensor, padding: int, flip: bool, generator: torch.Generator,
            part: slice | None = None, total: int | None = None) -> torch.Tensor:
    """Random crop after zero padding and random horizontal flip, on tensors.

    ``x`` may be the rows ``part`` of a batch of ``total`` rows (one rank's share):
    the random offsets and flips are drawn for the whole batch and this
    slice's are applied, so each row is augmented as in a single process.
    The crop is two ``gather`` calls (rows, then columns); a flip only reverses
    the columns gathered."""
    b, c, h, w = x.shape
    total = b if total is None else total
    part = slice(0, b) if part is None else part
    if padding <= 0 and not flip:
        return x
    cols = torch.arange(w, device=x.device).expand(b, w)
    if padding > 0:  # drawn first: offsets down, offsets across, then the flips
        dy = torch.randint(0, 2 * padding + 1, (total, 1), generator=generator)[part].to(x.device)
        dx = torch.randint(0, 2 * padding + 1, (total, 1), generator=generator)[part].to(x.device)
        x = torch.nn.functional.pad(x, (padding,) * 4)
        rows = dy + torch.arange(h, device=x.device)  # [b, h]
        x = x.gather(2, rows[:, None, :, None].expand(b, c, h, x.shape[3]))
        cols = dx + cols
    if flip:
        mirror = (torch.rand(total, generator=generator)[part] < 0.5).to(x.device)[:, None]
        cols = torch.where(mirror, cols.flip(1), cols)
    return x.gather(3, cols[:, None, None, :].expand(b, c, h, w))


def save_checkpoint(path, state: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def restore_rng(saved: dict, augment_rng: torch.Generator) -> None:
    torch.set_rng_state(saved["torch"])
    augment_rng.set_state(saved["augment"])
    random.setstate(saved["python"])
    if saved["cuda"]:
        torch.cuda.set_rng_state_all(saved["cuda"])


def train(run: Run, resume: bool = False) -> dict:
    """Train the run's configuration; with ``resume``, continue from its last
    checkpoint: the metrics file is cut back to that checkpoint and every state
    (weights, optimiser, schedule, RNG streams) is restored, so the result is
    the one an uninterrupted run would have reached."""
    # -- setup -------------------------------------------------------------
    cfg = run.config()
    tcfg, ecfg = cfg["train"], cfg["eval"]
    registry = load_registry(load_settings().plugin_dirs)
    random.seed(cfg["seed"])
    torch.manual_seed(cfg["seed"])
    # Under torchrun (--gpus N) each rank trains on its slice of every batch;
    # rank 0 alone writes the run store and evaluates (fslab.training.distributed).
    world = distributed.World.from_env()
    if world.size != tcfg.get("processes", 1):
        raise RuntimeError(f"the run is configured for train.processes={tcfg.get('processes', 1)} "
                           f"but runs in {world.size} processes; start it with fslab run/resume")
    device = pick_device(cfg["device"]) if world.size == 1 else distributed.start(cfg["device"], world)[1]
    checkpoint = None
    if resume:
        checkpoint = torch.load(run.checkpoint_path, map_location=device, weights_only=True)
        if world.main:
            truncate_to_checkpoint(run, checkpoint["epoch"])
    log = EventLog(run, enabled=world.main)

    dataset = create_dataset(registry, cfg)
    train_split, val_split = dataset.load("train"), dataset.load("val")
    model = registry.create("backbone", cfg["backbone"]["name"], in_channels=dataset.channels,
                            **plugin_kwargs(cfg["backbone"])).to(device)
    # A training-only linear projection on top of the backbone (NCA paper App. A.4).
    head = torch.nn.Identity()
    if tcfg["projection_dim"] > 0:
        head = torch.nn.Linear(model.out_dim, tcfg["projection_dim"]).to(device)
    model = distributed.synchronise_batch_norm(model, world, device)  # global-batch statistics when N > 1
    embed_dim = tcfg["projection_dim"] or model.out_dim
    loss_fn = registry.create("loss", cfg["loss"]["name"], **plugin_kwargs(cfg["loss"]),
                              context={"out_dim": embed_dim, "num_classes": len(train_split.classes)})
    trainable = list(model.parameters()) + list(head.parameters())
    if isinstance(loss_fn, torch.nn.Module):  # e.g. a loss with learnable parameters
        loss_fn.to(device)
        trainable += list(loss_fn.parameters())
    sampler = registry.create("sampler", cfg["sampler"]["name"], labels=train_split.labels.tolist(),
                              batch_size=tcfg["batch_size"], seed=cfg["seed"], **plugin_kwargs(cfg["sampler"]))
    classify = registry.create("evaluator", cfg["evaluator"]["name"], **plugin_kwargs(cfg["evaluator"]))
    optimizer = make_optimizer(trainable, tcfg)
    steps_per_epoch = len(sampler)
    total_steps = tcfg["epochs"] * steps_per_epoch
    milestones = sorted({max(1, round(f * total_steps)) for f in tcfg["milestones"]})
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones, gamma=tcfg["gamma"])
    augment_rng = torch.Generator().manual_seed(cfg["seed"])
    images, labels = train_split.images, train_split.labels
    if images.numel() < 2**31:  # small enough to keep the whole split on the device
        images, labels = images.to(device), labels.to(device)

    feature_stages = ecfg.get("feature_stages", 1)  # configs saved before the key existed: 1
    feature_network(model, feature_stages)  # a backbone without that many stages fails now, not after epoch 1

    def features_of(split_images):
        """Evaluation features (``eval.feature_stages``); the training mean goes through here too."""
        network = feature_network(model, feature_stages)
        return evaluation.extract_features(network, split_images, ecfg["batch_size"], device, to_input)

    def training_mean():
        if not ecfg["center"]:
            return None
        count = len(train_split) if ecfg["center_images"] <= 0 else min(ecfg["center_images"], len(train_split))
        pick = torch.randperm(len(train_split), generator=torch.Generator().manual_seed(ecfg["seed"]))[:count]
        return features_of(images[pick]).mean(0)

    def evaluate(split, split_name, shots, episodes, center, **where) -> list[tuple[int, float, float]]:
        """Log and return (shots, score, ci95) for each episode shape (score: the
        evaluator's metric, accuracy by default); the test's per-episode scores
        are saved for paired comparisons. A model-aware evaluator (fine-tuning)
        runs at most its own default number of episodes."""
        traits = evaluation.traits(classify)
        if traits.needs_model:
            episodes = min(episodes, traits.default_episodes)
        feats = None if traits.needs_model else features_of(split.images)
        outcomes = []
        for n, q in evaluation.episode_shapes(classify, shots, ecfg["queries"]):
            scores = evaluation.run_episodes(classify, split.labels, ecfg["ways"], n, q, episodes, ecfg["seed"],
                                             features=feats, model=feature_network(model, feature_stages),
                                             images=split.images, to_input=to_input, device=device, center=center,
                                             normalize=ecfg["normalize"])
            mean, ci = evaluation.ci95(scores)
            record = {"ways": ecfg["ways"], "shots": n, "queries": q, "episodes": episodes,
                      "evaluator": evaluator_label(cfg["evaluator"]), "metric": traits.metric, "accuracy": mean, "ci95": ci}
            log.write("eval", split=split_name, **record, **where)
            if split_name == "test":
                run.save_accuracies({"split": "test", **record, "seed": ecfg["seed"], "stream": evaluation.EPISODE_STREAM,
                                     "epoch": tcfg["epochs"]}, scores.tolist())
            outcomes.append((n, mean, ci))
        return outcomes

    log.write("start", device=str(device), epochs=tcfg["epochs"], steps_per_epoch=steps_per_epoch,
              total_steps=total_steps, train_images=len(train_split), backbone_params=sum(p.numel() for p in model.parameters()),
              out_dim=getattr(model, "out_dim", None), processes=world.size)

    # -- training ----------------------------------------------------------
    first_epoch, step, best_val, center = 0, 0, None, None
    if checkpoint is not None:
        model.load_state_dict(checkpoint["model"])
        head.load_state_dict(checkpoint["head"])
        if isinstance(loss_fn, torch.nn.Module):
            loss_fn.load_state_dict(checkpoint["loss"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        restore_rng(checkpoint["rng"], augment_rng)
        first_epoch, step, best_val = checkpoint["epoch"], checkpoint["step"], checkpoint["best_val"]
        center = checkpoint["train_mean"]
        log.write("resume", epoch=first_epoch, step=step)
    elif ecfg["before_training"] and world.main:  # the untrained network's accuracy, as epoch 0
        evaluate(val_split, "val", [ecfg["val_shots"]], ecfg["val_episodes"], training_mean(), epoch=0, step=0)
    # loss(head(model(x))) over the global batch; under DDP when there are several ranks
    train_step = distributed.training_step(model, head, loss_fn, world, device)
    for epoch in range(first_epoch, tcfg["epochs"]):
        model.train()
        window_start, window_images = time.perf_counter(), 0
        for batch in sampler.batches(epoch):
            index = torch.as_tensor(batch.indices, device=images.device)
            own = world.rows(len(index))  # this rank's rows of the global batch (all of it with one process)
            x = to_input(images[index[own]].to(device, non_blocking=True))
            x = augment(x, tcfg["crop_padding"], tcfg["flip"], augment_rng, part=own, total=len(index))
            y = labels[index].to(device, non_blocking=True)
            support = None if batch.support is None else torch.as_tensor(batch.support, device=device)
            out = train_step(x, y, support)
            optimizer.zero_grad(set_to_none=True)
            out.loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            window_images += len(index)
            if step % tcfg["log_every"] == 0 or step % steps_per_epoch == 0:
                loss_value = out.loss.item()  # the one device sync per interval
                if not math.isfinite(loss_value):
                    raise FloatingPointError(f"loss became {loss_value} at step {step} (epoch {epoch + 1}); try a lower --lr")
                elapsed = time.perf_counter() - window_start
                extra = {k: float(v) for k, v in (out.extra or {}).items()}
                log.write("train", step=step, epoch=epoch + 1, loss=loss_value, positives=int(out.positives),
                          negatives=int(out.negatives), lr=optimizer.param_groups[0]["lr"],
                          images_per_s=window_images / max(elapsed, 1e-9), **extra)
                window_start, window_images = time.perf_counter(), 0

        # -- validation and checkpoint, once per epoch (rank 0; the others wait)
        if not world.main:
            world.barrier()
            continue
        center = training_mean()
        for _, accuracy, ci in evaluate(val_split, "val", [ecfg["val_shots"]], ecfg["val_episodes"], center,
                                        epoch=epoch + 1, step=step):
            best_val = accuracy if best_val is None else max(best_val, accuracy)
        save_checkpoint(run.checkpoint_path, {
            "model": model.state_dict(), "head": head.state_dict(), "optimizer": optimizer.state_dict(),
            "loss": loss_fn.state_dict() if isinstance(loss_fn, torch.nn.Module) else {},
            "scheduler": scheduler.state_dict(), "epoch": epoch + 1, "step": step, "config": cfg,
            "best_val": best_val,
            "train_mean": center, "rng": {"torch": torch.get_rng_state(), "augment": augment_rng.get_state(),
                                          "python": random.getstate(),
                                          "cuda": torch.cuda.get_rng_state_all() if device.type == "cuda" else []},
        })
        log.write("checkpoint", epoch=epoch + 1, step=step, path=str(run.checkpoint_path.relative_to(run.path)))
        world.barrier()

    # -- final test evaluation (rank 0) --------------------------------------
    if not world.main:
        return {}
    test_split = dataset.load("test")  # `center` is still the final network's training mean
    test = {f"{n}-shot": {"accuracy": acc, "ci95": ci} for n, acc, ci in
            evaluate(test_split, "test", ecfg["shots"], ecfg["test_episodes"], center, step=step)}
    results = {"run": run.id, "method": cfg["method"], "dataset": cfg["dataset"]["name"],
               "backbone": cfg["backbone"]["name"], "ways": ecfg["ways"], "queries": ecfg["queries"],
               "episodes": ecfg["test_episodes"], "test": test, "best_val_accuracy": best_val,
               "epochs": tcfg["epochs"], "steps": step}
    atomic_write_json(run.path / "results.json", results)
    log.write("end", results=test)
    return results
