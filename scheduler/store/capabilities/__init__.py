"""What the store can do, one module per capability (jobs, occurrences, leases, settlement,
adjudication, authority, runtime control, domain migrations …), each a mixin of
:class:`~scheduler.store.facade.SchedulerStore` written as dialect-free SQLAlchemy Core over a
``Tx``."""
