from allocator.placement.busy_gpus import blockers, describe_blockers
from allocator.records.types import WorkerRecord


def _worker(job: str, state: str, gpus: tuple[int, ...], device: str = "cuda") -> WorkerRecord:
    return WorkerRecord(job=job, host="node1", state=state, gpus=gpus, device=device)  # type: ignore[arg-type]


def test_a_released_jobs_running_worker_blocks_the_gpus_it_still_runs_on() -> None:
    workers = [_worker("train", "running", (0, 1))]
    assert blockers("r1", [0], workers, held={}) == {"train": (0,)}


def test_a_stopping_worker_blocks_and_a_stopped_one_does_not() -> None:
    workers = [_worker("a", "stopping", (0,)), _worker("b", "stopped", (0,))]
    assert blockers("r1", [0], workers, held={}) == {"a": (0,)}


def test_a_job_still_holding_the_gpu_shares_it_and_blocks_nothing() -> None:
    workers = [_worker("train", "running", (0, 1))]
    assert blockers("r1", [0, 1], workers, held={"train": (1,)}) == {"train": (0,)}
    assert blockers("r1", [1], workers, held={"train": (1,)}) == {}


def test_own_workers_other_gpus_and_cpu_workers_block_nothing() -> None:
    workers = [
        _worker("r1", "running", (0,)),
        _worker("other", "running", (2,)),
        _worker("cpu", "running", (0,), device="cpu"),
    ]
    assert blockers("r1", [0], workers, held={}) == {}


def test_the_wait_names_each_worker_and_its_gpus() -> None:
    text = describe_blockers({"train": (0,), "eval": (1, 2)})
    assert text == "eval's worker on GPUs 1,2 and train's worker on GPU 0"
