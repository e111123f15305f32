from allocator.placement.busy_gpus import blockers, describe_blockers, leftovers
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


def test_a_process_of_an_ended_holding_blocks_the_gpus_it_was_given() -> None:
    where = ("/p", "node1")
    carried = {
        "/p:old@node1/10.5": (0, 1),  # ended: the store no longer has it
        "/p:r1@node1/20.6": (0,),  # the new holding itself
        "/p:mine@node1/30.7": (2,),  # ended, on another GPU
        "/q:old@node1/10.5": (0,),  # another namespace's
        "/p:old@node2/10.5": (0,),  # another host's
    }
    current = ["/p:r1@node1/20.6"]
    assert leftovers([0], carried, current, where) == {"old": (0,)}
    assert leftovers([0], carried, [*current, "/p:old@node1/10.5"], where) == {}


def test_the_wait_names_leftover_processes_too() -> None:
    text = describe_blockers({}, {"old": (0,)})
    assert text == "old's ended holding's processes on GPU 0"
