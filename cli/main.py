"""The `q2real` command: `train`, `finetune`, `eval`, `export`, `render`, `deploy`, `learn`, `transfer`, `demos`,
`envs`, `presets`, `config`, `rollout`.

Job commands take `--preset NAME|FILE` and `key.sub=value` overrides, resolved in that order on top of
the job's dataclass defaults; `--print-config` shows the result without running anything.

q2real's own errors (a config key, a spec field, a bundle, a checkpoint, the gate) print as one line
and exit 2; anything else is a bug and keeps its traceback. `--debug` shows the traceback for ours too.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
from typing import TYPE_CHECKING

import yaml

from q2real.configs.errors import Q2RealError
from q2real.configs.loader import ConfigError, list_presets, load, parse_overrides, to_dict

if TYPE_CHECKING:  # the commands import their modules when run, so `q2real --help` stays quick
    from q2real.residual.train import ResidualTrainer


def _envs(args: argparse.Namespace) -> int:
    from q2real.hardware import robot_spec
    from q2real.sim import registry

    if args.task:
        info = registry.describe(args.task)
        spec = robot_spec(info.robot)
        print(f"{info.name}  (robot: {spec.name}, spec: {spec.source})\n")
        print(info.summary, "\n")
        print(f"control period {spec.control_period} s, {spec.control_mode} control, joints {spec.joint_names}")
        print("default task_params:")
        print(yaml.safe_dump(to_dict(info.config), sort_keys=False), end="")
        return 0
    rows = [("task", "robot", "obs", "act", "control", "episode", "cost", "backends")]
    for name in registry.task_names():
        info = registry.describe(name)
        env = registry.make_task(task=name, num_envs=1, backend="mujoco", device="cpu")
        spec = env.spec
        rows.append(
            (
                name,
                spec.name,
                str(env.obs_dim),
                str(env.action_dim),
                f"{1 / spec.control_period:g} Hz",
                f"{info.config.episode_length} steps",
                "yes" if env.has_cost else "-",
                "mujoco, mjx",
            )
        )
        env.close()
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    print("\nadapters:")
    for prefix, text in registry.ADAPTERS.items():
        print(f"  {prefix}:<name>  {text}")
    return 0


def _presets(args: argparse.Namespace) -> int:
    for name in list_presets():
        print(name)
    return 0


def _config(args: argparse.Namespace) -> int:
    """The config reference, the same Markdown as the documentation's page, or one part of it."""
    from q2real.cli.config_reference import page, part

    print(part(args.doc) if args.doc else page(), end="")
    return 0


def _rollout(args: argparse.Namespace) -> int:
    from q2real.agents.rollout import RolloutConfig, rollout

    config = load(RolloutConfig, args.preset, args.overrides)
    if args.print_config:
        print(yaml.safe_dump(to_dict(config), sort_keys=False), end="")
        return 0
    path = rollout(config)
    print(f"run directory: {path}")
    return 0


def _no_checkpoint(resume) -> str:
    if not resume.exists():
        return f"--resume {resume}: no such run directory"
    if not resume.is_dir():
        return f"--resume {resume}: not a directory (give the run directory that holds checkpoint.pt)"
    return f"--resume {resume}: no checkpoint.pt in that directory"


def _run_trainer(trainer, args: argparse.Namespace, report: bool = True) -> int | None:
    """Run a training job to its end and print where it went (unless not `report`: a rank other than
    0); on Ctrl-C (checkpoint written) or non-finite values, say how to continue and return the exit status."""
    from q2real.agents.common.guard import NonFiniteError

    try:
        trainer.run()
    except KeyboardInterrupt:
        print(f"\ninterrupted at env step {trainer.step}; checkpoint written to {trainer.last_checkpoint}")
        print(f"continue with: q2real {args.command} --resume {trainer.path}", file=sys.stderr)
        return 130
    except NonFiniteError as err:
        if args.debug:
            raise
        print(f"q2real {args.command}: {err}", file=sys.stderr)
        return 3
    if report:
        print(f"run directory: {trainer.path}")
        print(f"learning curve: {trainer.path / 'curves.png'}")
    return None


def _train(args: argparse.Namespace) -> int:
    from pathlib import Path

    from q2real.agents.config import TrainConfig
    from q2real.agents.distributed import Ranks
    from q2real.agents.jobs import job_kind
    from q2real.agents.train import Trainer

    resume = Path(args.resume) if args.resume else None
    preset = args.preset
    if resume is not None:
        if preset:
            raise ConfigError("--resume takes the run's own config.yaml; pass changes as overrides, not --preset")
        if not (resume / "checkpoint.pt").is_file():
            raise ConfigError(_no_checkpoint(resume))
        preset = str(resume / "config.yaml")
    kind = job_kind(preset, args.overrides)

    ranks = Ranks.launched()
    if ranks is not None and kind in ("bc", "stream"):
        raise ConfigError(
            f"torchrun: a {kind} job trains in one process (data-parallel training runs the off-policy loop); "
            "start it without torchrun"
        )
    if kind == "bc":
        return _train_bc(args, preset)
    from q2real.agents.stream.train import StreamTrainConfig, StreamTrainer
    from q2real.residual.train import ResidualTrainConfig, ResidualTrainer

    job = {"residual": ResidualTrainConfig, "stream": StreamTrainConfig}.get(kind, TrainConfig)
    config = load(job, preset, args.overrides)
    if args.print_config:
        print(yaml.safe_dump(to_dict(config), sort_keys=False), end="")
        return 0
    if isinstance(config, ResidualTrainConfig):
        trainer = ResidualTrainer(config, resume=resume)
    elif isinstance(config, StreamTrainConfig):
        trainer = StreamTrainer(config, resume=resume)
    else:
        trainer = Trainer(config, resume=resume)
    leader = ranks is None or ranks.leader
    failed = _run_trainer(trainer, args, report=leader)
    if failed is not None or not leader:
        return failed or 0
    print(f"checkpoint: {trainer.last_checkpoint}")
    success = f", success {trainer.last_eval_success:.2f}" if trainer.last_eval_success is not None else ""
    limit = getattr(
        getattr(config, "agent", None), "cost_limit", None
    )  # a constrained learner: its cost is half the result
    cost = f", episode cost {trainer.last_eval_cost:.1f} (limit {limit})" if limit is not None else ""
    print(f"final evaluation: mean return {trainer.last_eval:.1f} over {config.eval_envs} episodes{success}{cost}")
    if isinstance(trainer, ResidualTrainer) and trainer.base_eval is not None:
        print(_against_base(trainer))
    return 0


def _against_base(trainer: ResidualTrainer) -> str:
    """The residual's last evaluation beside its base's, on the same episodes; a loss is said loudly."""
    base = trainer.config.residual.base
    success = f", success {trainer.base_eval_success:.2f}" if trainer.base_eval_success is not None else ""
    line = f"base alone ({base}) on the same episodes: mean return {trainer.base_eval:.1f}{success}"
    if trainer.below_base():
        return f"{line}\nBELOW ITS BASE: this residual does worse than {base} alone; keep the base, or train longer"
    return f"{line}; the residual is at or above its base"


def _finetune(args: argparse.Namespace) -> int:
    from pathlib import Path

    from q2real.agents.onrobot.finetune import FinetuneConfig, Finetuner, load_finetune_config

    if args.resume:
        resume = Path(args.resume)
        if not (resume / "checkpoint.pt").is_file():
            raise ConfigError(_no_checkpoint(resume))
        config = load_finetune_config(resume)
        if args.run_dir is not None and Path(args.run_dir).resolve() != Path(config.run).resolve():
            raise ConfigError(f"--resume {resume}: it fine-tunes {config.run}, not {args.run_dir}")
        if args.overrides:
            raise ConfigError("--resume continues the fine-tuning job as it was started; overrides are not taken")
    else:
        if args.run_dir is None or "=" in args.run_dir:
            raise ConfigError("expected RUN_DIR, the trained run to fine-tune (or --resume FINETUNE_DIR)")
        resume = None
        config = load(FinetuneConfig, args.preset, [*args.overrides, f"run={args.run_dir}"])
    if args.print_config:
        print(yaml.safe_dump(to_dict(config), sort_keys=False), end="")
        return 0
    trainer = Finetuner(config, resume=resume)
    failed = _run_trainer(trainer, args)
    if failed is not None:
        return failed
    print(f"final evaluation, robot's dynamics: mean return {trainer.last_eval:.1f} over {config.eval_envs} episodes")
    print(f"export the fine-tuned policy with: q2real export {trainer.path}")
    return 0


def _train_bc(args: argparse.Namespace, preset: str | None) -> int:
    from q2real.residual.bc import BCConfig, BCRun

    if args.resume:
        raise ConfigError("--resume: a BC run retrains in minutes; start a new one")
    config = load(BCConfig, preset, args.overrides)
    if args.print_config:
        print(yaml.safe_dump(to_dict(config), sort_keys=False), end="")
        return 0
    run = BCRun(config)
    print(f"bc: {run.demos.num_episodes} episodes, {len(run.demos.obs)} frames of {run.config.dataset}")
    run.run()
    print(f"run directory: {run.path}")
    print(f"stopped after {run.epochs} epochs; best validation loss {run.best_val:.5f}")
    if run.eval_return is not None:
        print(
            f"evaluation: mean return {run.eval_return:.1f}, success {run.eval_success:.2f} "
            f"over {config.eval_episodes} episodes"
        )
    return 0


def _demos(args: argparse.Namespace) -> int:
    from q2real.residual.dataset import read_lerobot, write_lerobot

    if args.demos_command == "info":
        demos = read_lerobot(args.dataset)
        lengths = demos.bounds() @ [-1, 1]
        print(
            f"{args.dataset}: task {demos.task or '(unknown)'}, {demos.num_episodes} episodes, "
            f"{len(demos.obs)} frames at {demos.fps:g} fps, episode length {lengths.min()}-{lengths.max()}"
        )
        print(
            f"observation {demos.obs.shape[1]}, action {demos.action.shape[1]}, "
            f"success {demos.episode_success().mean():.2f}, source: {demos.q2real.get('source', 'unknown')}"
        )
        return 0
    if args.demos_command == "import":
        from q2real.residual.robomimic import read_robomimic

        demos = read_robomimic(args.file, args.obs_keys)
        robots = demos.q2real.get("env_args", {}).get("env_kwargs", {}).get("robots", "")
        robot = robots[0] if isinstance(robots, list) and robots else robots if isinstance(robots, str) else ""
        write_lerobot(demos, args.out, robot_type=robot)
        print(f"{args.out}: {demos.num_episodes} episodes, {len(demos.obs)} frames from {args.file}")
        return 0
    return _demos_record(args)


def _demos_record(args: argparse.Namespace) -> int:
    from pathlib import Path

    from q2real.residual.dataset import write_lerobot
    from q2real.residual.record import RecordConfig, record
    from q2real.sim import make

    config = load(RecordConfig, args.preset, args.overrides)
    if args.print_config:
        print(yaml.safe_dump(to_dict(config), sort_keys=False), end="")
        return 0
    if not config.out:  # checked here, so --print-config shows the settings without one
        raise ConfigError("out: expected the folder to write the dataset to (out=DIR)")
    if Path(config.out).exists():  # before recording, not after it
        raise ConfigError(f"out: {config.out} already exists; demonstrations are written to a new folder")
    env = make(config.env)
    try:
        if config.policy == "expert":
            from q2real.residual.experts import make_expert

            expert = make_expert(config.env.task, env)
            policy, reset, source = expert, expert.reset, f"scripted expert {type(expert).__name__}"
        else:
            policy, reset = _bundle_policy(config.policy, env)
            source = f"bundle {config.policy}"
        recorded = record(env, policy, config.episodes, config.env, source, reset, config.successful_only, config.seed)
    finally:
        env.close()
    spec = getattr(env, "spec", None)
    names = {
        "observation.state": [
            f"{name}.{i}" for name, dim in zip(env.obs_names, env.obs_dims, strict=True) for i in range(dim)
        ],
        "action": list(spec.joint_names) if spec is not None else None,
    }
    write_lerobot(recorded.demos, config.out, robot_type=spec.name if spec is not None else "", names=names)
    ended, succeeded = recorded.episodes_recorded, round(recorded.success_rate * recorded.episodes_recorded)
    print(
        f"{config.out}: {recorded.demos.num_episodes} episodes, {len(recorded.demos.obs)} frames, kept of the "
        f"{ended} that ended (every env runs to the same tick); {source} succeeded in {succeeded} of those {ended} "
        f"({recorded.success_rate:.0%})"
    )
    return 0


def _bundle_policy(path: str, env):
    """A bundle's deterministic actions in [-1, 1] on `env`, chunks through the robot's queue."""
    import torch

    from q2real.agents.callbacks import ChunkExecutor
    from q2real.deploy_ros.bundle import PolicyBundle

    runner = PolicyBundle(path)

    def predict(obs: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(runner.normalized(runner(obs.cpu().numpy()))).to(env.device)

    chunk = runner.info.chunk
    if chunk.size == 1:
        return predict, None
    executor = ChunkExecutor(predict, chunk, env)
    return executor, executor.clear


def _eval(args: argparse.Namespace) -> int:
    from q2real.gate.evaluation import evaluate_run

    returns = evaluate_run(args.run_dir, episodes=args.episodes, seed=args.seed, bundle=args.bundle)
    print(
        f"{args.run_dir}: mean return {returns.mean():.2f} +- {returns.std():.2f} "
        f"(min {returns.min():.2f}, max {returns.max():.2f}) over {returns.numel()} episodes"
    )
    return 0


def _export(args: argparse.Namespace) -> int:
    from q2real.gate.evaluation import export_for_run

    path = export_for_run(args.run_dir, args.output)
    print(f"policy bundle: {path}")
    print(f"metadata: {path.with_suffix(path.suffix + '.json')}")
    return 0


def _render(args: argparse.Namespace) -> int:
    from q2real.gate.render import RenderSettings, render

    settings = RenderSettings(
        seconds=args.seconds,
        episodes=args.episodes,
        seed=args.seed,
        width=args.width,
        height=args.height,
        fps=args.fps,
        gif=args.gif,
    )
    shown = [0]

    def progress(done: int, total: int) -> None:
        if total >= 100 and (10 * done // total > shown[0] or done == total):  # every tenth of a long render
            shown[0] = 10 * done // total
            print(f"rendered {done}/{total} frames", flush=True)

    print(f"q2real render: {args.source} ({args.episodes} episode(s), up to {args.seconds:g} s each)", flush=True)
    result = render(args.source, args.out, settings, progress)
    returns = ", ".join(f"{r:.1f}" for r in result.returns.tolist())
    print(f"video: {result.video} ({result.frames} frames, {args.width}x{args.height} at {result.fps:.4g} fps)")
    if result.gif is not None:
        print(f"gif: {result.gif} ({result.gif.stat().st_size / 1e6:.2f} MB)")
    print(f"episode returns (whole episodes): {returns}")
    return 0


def _deploy(args: argparse.Namespace) -> int:
    from q2real.deploy_ros.session import deploy
    from q2real.deploy_ros.settings import NodeConfig
    from q2real.gate.sim_settings import perturbation_argv, video_argv

    overrides = [*args.overrides, *([f"finetune.run={args.finetune}"] if args.finetune else [])]
    overrides += [f"finetune.learner_address={args.learner}"] if args.learner else []
    config = load(NodeConfig, args.preset, overrides)
    sim_extra = perturbation_argv(args)
    if sim_extra and not args.sim:
        raise ConfigError("--shift, --reset-every and --command are the sim robot's: they need --sim")
    if args.record_video:
        if not args.sim:
            raise ConfigError("--record-video: the sim robot films its run: it needs --sim")
        from q2real.sim.filming import check_rendering

        check_rendering()  # the encoder and offscreen GL, before the node and the robot start
        sim_extra += video_argv(args)
    if args.sim and "autostart" not in parse_overrides(args.overrides):
        config = dataclasses.replace(config, autostart=True)  # nobody at a keyboard needs to start a simulated robot
    if args.print_config:
        print(yaml.safe_dump(to_dict(config), sort_keys=False), end="")
        return 0
    print(f"q2real deploy: {args.bundle} ({'sim robot, loopback DDS' if args.sim else 'waiting for the robot'})")
    if not args.sim and not config.autostart:
        print("press Enter to ramp to the default pose and hand over to the policy; Ctrl-C stops")
    summary = deploy(
        args.bundle,
        config,
        sim=args.sim,
        duration=args.duration,
        operator_start=not config.autostart,
        timings=args.timings,
        sim_extra=sim_extra,
    )
    print(
        f"stopped ({summary.stopped_by}) after {summary.ticks} ticks, in mode {summary.mode_at_stop}; then the "
        f"node sent its final command, the shield's stop ({summary.mode}); latency p50 {summary.latency_p50_ms:.3f} ms "
        f"p99 {summary.latency_p99_ms:.3f} ms; loop deadline misses {summary.loop_deadline_misses}; "
        f"refused messages {summary.refused_messages}"
    )
    print(_shield_report(summary))
    if summary.figures:
        print(summary.figures)
    stages = ", ".join(f"{name} {s['p99_ms']:.3f}" for name, s in summary.stages.items() if name != "total")
    print(f"tick path p99 ms: {stages}" + (f" (every tick in {args.timings})" if args.timings else ""))
    if summary.finetune is not None:
        tuned = summary.finetune
        print(
            f"fine-tuning: version {tuned['version']} running; {tuned['swaps']} swapped in, {tuned['accepted']} "
            f"accepted, {tuned['rollbacks']} rolled back, {tuned['refused']} refused; every version in "
            f"{tuned['directory']}"
        )
    return 0


def _shield_report(summary) -> str:
    """What the policy and the shield did, in the words of `shield rules`: a veto replaces the policy's
    command with the fallback (a hold), a clamp bounds it."""
    rules = summary.shield_counters
    vetoes = rules.get("VETO", 0)
    line = (
        f"policy: ran on {summary.policy_queries} of {summary.run_ticks} ticks in RUN; shield rules "
        f"{rules or 'none fired'}; its clamps changed the policy's command on {summary.run_interventions} of "
        f"those ticks, by {summary.run_change / max(summary.run_ticks, 1):.3f} per joint and tick in action units"
    )
    if summary.cost_q_range is not None:
        low, high = summary.cost_q_range
        line += f"; the cost critic vetoed {vetoes} ticks (Q_c {low:.4g} to {high:.4g})"
    return line


def _monitor(args: argparse.Namespace) -> int:
    from q2real.deploy_ros.watch.monitor import monitor

    print(
        f"q2real monitor: following {args.topic} (ROS_DOMAIN_ID {os.environ.get('ROS_DOMAIN_ID', '0')}); Ctrl-C stops"
    )
    shown = monitor(args.topic, args.duration, args.count, args.loopback)
    if not shown:
        print("no q2real node reported: is one running on this domain and network?", file=sys.stderr)
        return 1
    return 0


def _operator(args: argparse.Namespace) -> int:
    """Exit status 0 when the node carried the request out (or, for `status`, reported), 1 otherwise."""
    import math

    from q2real.configs import checks
    from q2real.deploy_ros.settings import NODE_NAME
    from q2real.deploy_ros.watch.remote import NoNode, operate, status

    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise ConfigError(f"--timeout: expected seconds > 0, got {args.timeout}")
    node = args.node or NODE_NAME
    try:
        checks.ros_name("--node", f"/{node}")
    except ValueError as err:
        raise ConfigError(str(err)) from None
    try:
        if args.request == "status":
            print(status(args.timeout, args.topic, args.loopback))
            return 0
        answer = operate(args.request, node, args.timeout, args.topic, args.loopback)
    except NoNode as err:
        print(f"q2real operator: {err}", file=sys.stderr)
        return 1
    print(answer.text)
    return 0 if answer.done else 1


def _learn(args: argparse.Namespace) -> int:
    """The workstation's end of the robot-to-learner link: serves robots (`q2real deploy B --learner`)
    one at a time, each session fine-tuning RUN_DIR on that robot's stream until Ctrl-C."""
    import time
    from pathlib import Path

    from q2real.agents.common.checkpoint import CHECKPOINT
    from q2real.agents.config import load_run_config
    from q2real.agents.onrobot.robot_learner import learner_config
    from q2real.deploy_ros.learning.link import Relay, Tls, serve
    from q2real.deploy_ros.settings import RobotLearningSettings

    learner = tuple(args.overrides)
    settings = RobotLearningSettings(
        run=args.run_dir, publish_every=args.publish_every, learner=learner, learner_startup=args.startup
    )
    try:
        settings.validate()
    except ValueError as err:
        flags = {"finetune.publish_every": "--publish-every", "finetune.learner_startup": "--startup"}
        message = str(err)
        for key, flag in flags.items():
            message = message.replace(key, flag)
        raise ConfigError(message.replace("finetune.learner", "KEY=VALUE")) from None
    # The run and the learner's own settings, checked now rather than when the first robot connects.
    load_run_config(Path(args.run_dir), CHECKPOINT)
    learner_config([f"run={args.run_dir}", *learner])
    if (args.tls_cert is None) != (args.tls_key is None) or (args.tls_client_ca and not args.tls_cert):
        raise ConfigError("--tls-cert and --tls-key go together; --tls-client-ca needs them")
    root = Path(args.directory or f"learn-{time.strftime('%Y%m%d-%H%M%S')}")
    relay = Relay(root, args.run_dir, learner, args.publish_every, args.startup)
    server, port = serve(args.serve, relay, Tls(args.tls_client_ca, args.tls_cert, args.tls_key))
    security = "TLS" if args.tls_cert else "plain TCP: use it on a trusted network only"
    print(f"q2real learn: fine-tuning {args.run_dir} for the robot that connects to port {port} ({security})")
    print(f"sessions in {root}; Ctrl-C stops", flush=True)
    signal.signal(signal.SIGTERM, _interrupted)  # a service manager's stop: end the session, checkpointed
    try:
        server.wait_for_termination()
    finally:
        server.stop(grace=5)
    return 0


def _interrupted(*_) -> None:
    raise KeyboardInterrupt


def _transfer(args: argparse.Namespace) -> int:
    """Exit status 1 when the gate fails, so a script can refuse to ship the bundle."""
    from q2real.gate.transfer import run_gate

    print(f"q2real transfer: {args.run_dir}")
    # Unset options keep the gate's own defaults.
    defaults = {k: v for k, v in (("ros_episodes", args.ros_episodes), ("threshold", args.threshold)) if v is not None}
    report = run_gate(
        args.run_dir,
        backend=args.backend,
        episodes=args.episodes,
        seed=args.seed,
        only=args.only,
        ros=args.ros,
        **defaults,
    )
    verdict = "PASSED" if report["passed"] else f"FAILED on {', '.join(report['failed_rows'])}"
    print(
        f"gate {verdict}: trained on {report['trained_backend']}, gated on {report['gate_backend']}; return as trained "
        f"{report['reference_return']:.2f} (no shield {report['unshielded_return']:.2f}); {_lowest_judged(report)}; "
        f"table {args.run_dir}/transfer.json, plot {args.run_dir}/transfer.png"
    )
    return 0 if report["passed"] else 1


def _lowest_judged(report: dict) -> str:
    """The row the verdict hangs on: the lowest interval bound (a lone episode's ratio) of the rows judged,
    whether or not training covered them, so the figure and the verdict always agree."""
    judged = [r for r in report["rows"] if r["required"]]
    if not judged:
        return "no row judged"
    row = min(judged, key=lambda r: r["ratio"] if r["low"] is None else r["low"])
    bound = row["ratio"] if row["low"] is None else row["low"]
    return f"lowest bound of a judged row {bound:.3f} ({row['name']}; threshold {report['threshold']:g})"


def _job_arguments(parser: argparse.ArgumentParser, example: str = "env.num_envs=256 env.task=...") -> None:
    """`example`: overrides this command takes (`--print-config` lists every key)."""
    parser.add_argument("--preset", help="preset name (`q2real presets`) or YAML file, applied before overrides")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help=f"e.g. {example}")


def build_parser() -> argparse.ArgumentParser:
    from q2real.gate.sim_settings import DEPLOY_FIELDS, add_arguments

    parser = argparse.ArgumentParser(prog="q2real", description="Off-policy RL from batched MuJoCo to ROS 2 robots")
    parser.add_argument("--debug", action="store_true", help="show the traceback of q2real's own errors too")
    # Also accepted after the command (`q2real train --debug`); SUPPRESS keeps a flag given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, **kwargs) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], **kwargs)

    train = command("train", help="train a learner (default: SAC on pendulum swing-up)")
    _job_arguments(train)
    train.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its checkpoint")
    train.set_defaults(func=_train)
    finetune = command("finetune", help="continue a trained run's learner on one (shifted) robot: the handoff")
    finetune.add_argument("run_dir", metavar="RUN_DIR", nargs="?", help="the trained run (config.yaml, checkpoint.pt)")
    _job_arguments(finetune, "total_steps=20000 'shift.actuator_gain_scale=[0.5,0.5]'")
    finetune.add_argument("--resume", metavar="FINETUNE_DIR", help="continue a fine-tuning run from its checkpoint")
    finetune.set_defaults(func=_finetune)
    evaluation = command("eval", help="roll out a trained run's deterministic policy and report returns")
    evaluation.add_argument("run_dir", metavar="RUN_DIR")
    evaluation.add_argument("--episodes", type=int, default=20)
    evaluation.add_argument("--seed", type=int, default=12345)
    evaluation.add_argument("--bundle", metavar="ONNX", help="act with this exported policy bundle instead")
    evaluation.set_defaults(func=_eval)
    export = command("export", help="export a run's policy as an ONNX policy bundle")
    export.add_argument("run_dir", metavar="RUN_DIR")
    export.add_argument("-o", "--output", metavar="ONNX", help="default: RUN_DIR/policy.onnx")
    export.set_defaults(func=_export)
    film = command("render", help="film a policy on its robot in simulation: an MP4 (and a GIF with --gif)")
    film.add_argument("source", metavar="RUN_DIR|BUNDLE", help="a training run directory or a policy bundle (.onnx)")
    film.add_argument("--out", metavar="MP4", help="default: BUNDLE with .mp4, or RUN_DIR/videos/policy.mp4")
    film.add_argument("--seconds", type=float, default=10.0, help="seconds of each episode to film (default 10)")
    film.add_argument("--episodes", type=int, default=1, help="episodes to film, one after the other")
    film.add_argument("--seed", type=int, default=12345)
    film.add_argument("--width", type=int, default=640)
    film.add_argument("--height", type=int, default=480)
    film.add_argument("--fps", type=float, default=25.0, help="frame rate aimed at (whole control steps per frame)")
    film.add_argument("--gif", action="store_true", help="also write a GIF for docs (<= 320 px wide, 12.5 fps)")
    film.set_defaults(func=_render)
    envs = command("envs", help="list registered tasks and env adapters")
    envs.add_argument("--task", help="show one task's description and default task_params")
    envs.set_defaults(func=_envs)
    command("presets", help="list shipped config presets").set_defaults(func=_presets)
    reference = command("config", help="document every config key: its type, default and what it does")
    reference.add_argument(
        "--doc",
        nargs="?",
        const="",
        required=True,
        metavar="NAME",
        help="print the reference: all of it, or one job, section or task (train, sac, env, shield, presets, ...)",
    )
    reference.set_defaults(func=_config)
    dep = command("deploy", help="run a policy bundle on a robot over ROS 2 (DDS), behind the shield")
    dep.add_argument("bundle", metavar="BUNDLE", help="policy bundle (.onnx) from `q2real export`")
    dep.add_argument("--sim", action="store_true", help="start the bundle's robot in simulation (loopback DDS)")
    dep.add_argument("--duration", type=float, help="seconds to run (default: until Ctrl-C)")
    dep.add_argument("--timings", metavar="CSV", help="write every tick's stage timestamps here when it stops")
    dep.add_argument("--finetune", metavar="RUN_DIR", help="fine-tune the policy on the robot, continuing this run")
    dep.add_argument("--learner", metavar="HOST:PORT", help="fine-tune it on a remote learner (`q2real learn --serve`)")
    add_arguments(dep, DEPLOY_FIELDS, "[sim robot] ")
    _job_arguments(dep, "autostart=true shield.ramp_time=2.0 record=session.mcap")
    dep.set_defaults(func=_deploy)
    mon = command("monitor", help="follow a running node's /diagnostics over DDS (no ROS install needed)")
    mon.add_argument("--topic", default="/diagnostics", help="the diagnostics topic (default /diagnostics)")
    mon.add_argument("--duration", type=float, help="seconds to follow (default: until Ctrl-C)")
    mon.add_argument("--count", type=int, help="stop after this many reports")
    mon.add_argument("--loopback", action="store_true", help="DDS on 127.0.0.1 only, as `deploy --sim` uses")
    mon.set_defaults(func=_monitor)
    op = command(
        "operator", help="start, stop, reset or e-stop a running node over DDS, or print its status (no ROS needed)"
    )
    op.add_argument(
        "request",
        choices=("start", "stop", "reset", "estop", "status"),
        help="published on the node's ~/start, ~/stop, ~/reset (std_msgs/Empty) or ~/estop (std_msgs/Bool true)",
    )
    op.add_argument("--node", help="the node's name, under which ~/ topics resolve (default q2real_policy)")
    op.add_argument("--timeout", type=float, default=5.0, help="seconds to find the node and hear its answer")
    op.add_argument("--topic", default="/diagnostics", help="the node's diagnostics topic (default /diagnostics)")
    op.add_argument("--loopback", action="store_true", help="DDS on 127.0.0.1 only, as `deploy --sim` uses")
    op.set_defaults(func=_operator)
    learn = command("learn", help="serve robots' fine-tuning: a learner on this machine for `deploy --learner`")
    learn.add_argument("run_dir", metavar="RUN_DIR", help="the trained run each robot session fine-tunes")
    learn.add_argument("--serve", required=True, metavar="HOST:PORT", help="listen here (e.g. 0.0.0.0:50051)")
    learn.add_argument("--directory", help="sessions go here (default: a new learn-<time> folder)")
    learn.add_argument("--publish-every", type=float, default=5.0, help="seconds between published versions")
    learn.add_argument("--startup", type=float, default=120.0, help="seconds the learner may take to load the run")
    learn.add_argument("--tls-cert", help="PEM: this learner's certificate (TLS on)")
    learn.add_argument("--tls-key", help="PEM: its private key")
    learn.add_argument("--tls-client-ca", help="PEM: accept only robots whose certificate this CA signed")
    learn.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="q2real finetune settings of the learner")
    learn.set_defaults(func=_learn)
    gate = command(
        "transfer",
        help="sim-to-sim transfer gate: the run's bundle, shielded, on the other backend under perturbations",
    )
    gate.add_argument("run_dir", metavar="RUN_DIR")
    gate.add_argument("--backend", choices=("mujoco", "mjx"), help="default: the backend the run did not train on")
    gate.add_argument("--episodes", type=int, default=16, help="episodes per row (one per env)")
    gate.add_argument("--seed", type=int, default=54321)
    gate.add_argument("--only", nargs="+", metavar="ROW", help="evaluate only these rows (e.g. nominal payload)")
    gate.add_argument("--ros", action="store_true", help="also run the bundle through the ROS 2 node and sim robot")
    gate.add_argument(
        "--ros-episodes", type=int, help="episodes through the node, real time each (default 8, at most --episodes)"
    )
    gate.add_argument("--threshold", type=float, help="lowest ratio interval bound a row may have (default 0.9)")
    gate.set_defaults(func=_transfer)
    demos = command("demos", help="demonstrations: record (scripted expert or bundle), import robomimic, inspect")
    demos_sub = demos.add_subparsers(dest="demos_command", required=True)
    rec = demos_sub.add_parser("record", parents=[common], help="roll out an expert or a bundle into a dataset")
    _job_arguments(rec, "out=demos/reach episodes=100 env.task=panda_reach")
    imp = demos_sub.add_parser("import", parents=[common], help="convert a robomimic hdf5 file to a dataset")
    imp.add_argument("file", metavar="HDF5")
    imp.add_argument("out", metavar="DATASET_DIR")
    imp.add_argument("--obs-keys", nargs="+", metavar="KEY", help="low-dimensional obs keys, in order")
    info = demos_sub.add_parser("info", parents=[common], help="summarize a dataset")
    info.add_argument("dataset", metavar="DATASET_DIR")
    demos.set_defaults(func=_demos)
    roll = command("rollout", help="run a random or zero policy through a task and log its returns")
    _job_arguments(roll)
    roll.set_defaults(func=_rollout)
    return parser


def main(argv: list[str] | None = None) -> int:
    if "TORCHELASTIC_RUN_ID" in os.environ:
        # Under torchrun: a rank's uncaught error is written where the elastic agent reports it.
        from torch.distributed.elastic.multiprocessing.errors import record

        return record(_main)(argv) or 0
    return _main(argv)


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # argparse cannot take positionals after options (`deploy B --sim k=v`); overrides are recognisable.
    if extra and hasattr(args, "overrides") and all("=" in item and not item.startswith("-") for item in extra):
        args.overrides += extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.func(args)
    except Q2RealError as err:
        if args.debug:
            raise
        print(f"q2real {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"q2real {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
