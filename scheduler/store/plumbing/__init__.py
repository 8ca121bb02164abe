"""How a store operation runs: runners open the transaction and sample the clock (``session``,
``nested_runner``, ``runner_base``), hand the operation a ``Tx`` (``tx``), execute its statements
compiled once (``statement_plans``, ``fastpath``, ``write_batch``), and classify what fails
(``failures``). Nothing here knows what a job or an occurrence is."""
