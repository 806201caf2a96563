"""`draftgate sim`: one simulated vLLM server, and the simulator's calibration report."""

from __future__ import annotations

import logging
import signal
from typing import TYPE_CHECKING, Annotated

import typer
import uvicorn

from backends.methods import VLLM_VERSION
from gateway.cli.common import LOG_FORMAT, fail
from gateway.cli.serve import Port, exit_zero

if TYPE_CHECKING:
    from backends.sim.config import SimConfig

sim_app = typer.Typer(help="Simulated vLLM servers.", invoke_without_command=True)

# The options of `sim` whose help would not fit beside their name.
Method = Annotated[str, typer.Option(help="plain, eagle3, p-eagle, dflash, dspark, ...")]
Workload = Annotated[str, typer.Option(help="Acceptance profile: code, chat, mixed, math.")]
SchedulingPolicy = Annotated[
    str, typer.Option(help="vLLM's --scheduling-policy: fcfs, or priority (lower first).")
]
MemoryShare = Annotated[
    float, typer.Option(min=0.01, max=1.0, help="Share of GPU memory for weights + KV.")
]
PrefixCaching = Annotated[
    bool, typer.Option(help="Cache prompt blocks and skip their prefill (vLLM's default).")
]
PromptTokensDetails = Annotated[
    bool,
    typer.Option(help="As vLLM's: usage says the prompt tokens found in the prefix cache."),
]
Delay = Annotated[
    float, typer.Option(min=0, help="Seconds every completion waits before answering.")
]
EngineVersion = Annotated[str, typer.Option(help="What /version says (simulate an upgrade).")]
ApiKey = Annotated[str | None, typer.Option(help="As vLLM's --api-key: required on /v1 routes.")]


@sim_app.callback()
def sim(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Option(help="Catalog model to simulate.")] = None,
    method: Method = "plain",
    k: Annotated[int | None, typer.Option(help="Speculative tokens (default per method).")] = None,
    gpu: str = "B200",
    gpu_count: Annotated[int, typer.Option(min=1)] = 1,
    port: Port = 8101,
    host: str = "127.0.0.1",
    served_model_name: str | None = None,
    workload: Workload = "chat",
    time_scale: Annotated[float, typer.Option(help="Run simulated time X times as fast.")] = 1.0,
    max_num_seqs: Annotated[int, typer.Option(min=1)] = 256,
    scheduling_policy: SchedulingPolicy = "fcfs",
    max_model_len: Annotated[int | None, typer.Option(min=16)] = None,
    gpu_memory_utilization: MemoryShare = 0.9,
    enable_prefix_caching: PrefixCaching = True,
    block_size: Annotated[int, typer.Option(min=1, help="Tokens per KV block.")] = 16,
    adaptive_verification: bool = False,
    per_request_spec_metrics: bool = False,
    enable_prompt_tokens_details: PromptTokensDetails = False,
    seed: int = 0,
    error_rate: Annotated[float, typer.Option(min=0, max=1)] = 0.0,
    stall_rate: Annotated[float, typer.Option(min=0, max=1)] = 0.0,
    drop_rate: Annotated[float, typer.Option(min=0, max=1)] = 0.0,
    crash_after_s: Annotated[float | None, typer.Option(min=0)] = None,
    startup_delay_s: Annotated[float, typer.Option(min=0)] = 0.0,
    delay_s: Delay = 0.0,
    api_key: ApiKey = None,
    engine_version: EngineVersion = VLLM_VERSION,
) -> None:
    """Run one simulated vLLM server (vLLM's API and /metrics over a modelled engine)."""
    if ctx.invoked_subcommand is not None:
        return
    model = model or fail("--model is required (e.g. --model openai/gpt-oss-20b)")
    from backends.sim.config import Faults, SimConfig

    faults = Faults(error_rate, stall_rate, drop_rate, crash_after_s, startup_delay_s, delay_s)
    given = locals()  # every option that names a field of the configuration is that field
    fields = {name: given[name] for name in SimConfig.__dataclass_fields__ if name in given}
    config = SimConfig(**fields)
    _serve_simulator(config, host, port)


def _serve_simulator(config: SimConfig, host: str, port: int) -> None:
    """Run the simulated server until stopped; exit 2 on a configuration it refuses."""
    from backends.sim.server import SimServer

    try:
        server = SimServer(config)
    except (ValueError, KeyError) as exc:
        fail(str(exc))
    logging.basicConfig(level="INFO", format=LOG_FORMAT)
    speculative = f", K={config.k}" if config.k else ""
    logging.getLogger("backends.sim").info(
        "simulated vLLM %s serving %s (%s%s) on %s GPU(s) at http://%s:%d, time scale %g",
        config.engine_version, config.model, config.method, speculative,
        config.gpu, host, port, config.time_scale,
    )  # fmt: skip
    signal.signal(signal.SIGTERM, exit_zero)
    uvicorn.run(server, host=host, port=port, log_level="warning", access_log=False)


@sim_app.command("calibrate")
def sim_calibrate(
    steps: Annotated[int, typer.Option(min=100, help="Engine steps per measured point.")] = 3000,
) -> None:
    """Print every published figure beside the simulator's; exit 1 if one misses its bar."""
    from backends.sim.calibrate import report

    lines, ok = report(steps)
    typer.echo("\n".join(lines))
    typer.echo("every calibrated figure is within its bar" if ok else "some figures miss their bar")
    raise typer.Exit(0 if ok else 1)
