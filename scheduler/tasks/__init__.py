"""Tasks: a decorated function and one ``defer`` call (API §10).

```python
from scheduler import Tasks, RetryPolicy

tasks = Tasks("postgresql+psycopg://app@db/app", queues={"emails": {"concurrency": 3}})

@tasks.task(queue="emails", max_attempts=5, retry=RetryPolicy(base_ms=1_000), timeout_ms=30_000)
def send_welcome(user_id: int, locale: str = "en") -> dict: ...

run = send_welcome.defer(user_id=42)     # a TaskRun
run.result(timeout_s=10)                 # once a worker ran it: scheduler worker myapp.tasks:tasks
```

A task is a job (its name is the job id), a queue a job kind, a run an occurrence whose payload
holds the call's arguments: the store underneath is the same, with the same guarantees. See
docs/tasks.md.
"""

from __future__ import annotations

from scheduler.tasks.errors import TaskCancelled, TaskFailed
from scheduler.tasks.run import TaskRun
from scheduler.tasks.task import Task
from scheduler.tasks.tasks import DEFAULT_PRINCIPAL, Tasks
from scheduler.tasks.worker import TaskWorker
from scheduler.worker.policy import RetryPolicy

__all__ = [
    "DEFAULT_PRINCIPAL",
    "RetryPolicy",
    "Task",
    "TaskCancelled",
    "TaskFailed",
    "TaskRun",
    "TaskWorker",
    "Tasks",
]
