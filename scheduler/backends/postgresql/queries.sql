-- The hand-tuned statements of a settle_and_claim and of an enqueue on PostgreSQL, as the server
-- runs them.
--
-- Each statement starts with a "-- name: <name>" line; scheduler/backends/postgresql/queries.py
-- loads them. {table} stands for a scheduler table in the store's schema (the loader writes the
-- qualified name); :name is a bound parameter. Every settle_and_claim statement takes
--
--   :p_id          the settled occurrence            :p_owner, :p_fence  its lease
--   :now           the injected clock's ms, or NULL: the server's clock, read after the lock
--   :job_kinds     text[] of kinds a claim may take, or NULL: any kind
--   :workspace_id  the workspace a claim is limited to, or NULL: any workspace
--
-- and the cycle statements also :p_result (the success's result JSON) and :p_lease (ms). A
-- literal colon before a word would read as a parameter: the claim event's JSON writes
-- "previousOwner": and its null as two strings.
--
-- The order of the seed is CASE WHEN running THEN lease_expires_at ELSE available_at END,
-- scheduled_for, occurrence_id. The heads come from the index scheduler_occurrences_claim
-- (status, available_at, lease_expires_at, scheduled_for, occurrence_id) and, for expired
-- leases, scheduler_pg_occurrences_expired (lease_expires_at, occurrence_id). Why each piece is
-- there: cycle_read.py and cycle_statement.py, beside this file.


-- name: claim_head
-- A quiet single claim (claim_next, claim_batch's first, a settle_and_claim inside a caller's
-- transaction): the first due row of each waiting status and one expired lease the call could act
-- on, with their checks as columns, and the earliest head locked SKIP LOCKED if a claim may take
-- it on its probed row alone (no expired lease to act on, its job eligible, attempts left, no
-- runtime control and no requeue request). claim_query builds the same probe in Core for SQLite.
WITH heads AS (
    (SELECT 'q' AS arm, occurrence_id
     FROM {occurrences}
     WHERE status = 'queued' AND available_at <= CAST(:now AS bigint)
     ORDER BY available_at, lease_expires_at, scheduled_for, occurrence_id
     LIMIT 1)
    UNION ALL
    (SELECT 'r', occurrence_id
     FROM {occurrences}
     WHERE status = 'retry_wait' AND available_at <= CAST(:now AS bigint)
     ORDER BY available_at, lease_expires_at, scheduled_for, occurrence_id
     LIMIT 1)
    UNION ALL
    (SELECT 'e', o.occurrence_id  -- an expired lease to sweep, or to claim again
     FROM {occurrences} AS o
     LEFT JOIN {scheduler_occurrence_controls} AS c ON c.occurrence_id = o.occurrence_id
     WHERE o.status = 'running' AND o.lease_expires_at <= CAST(:now AS bigint)
       AND (    (o.attempt >= o.max_attempts
                 AND (c.state IS NULL OR (c.state <> 'pause_requested' AND c.state <> 'resumed')))
            OR  (EXISTS (SELECT 1 FROM {jobs} AS j
                         WHERE j.job_id = o.job_id AND j.enabled = 1
                           AND (CAST(:job_kinds AS text[]) IS NULL OR j.kind = ANY (CAST(:job_kinds AS text[])))
                           AND (CAST(:workspace_id AS text) IS NULL
                                OR CAST(j.authority_json AS json) ->> 'workspaceId' = CAST(:workspace_id AS text))
                         OFFSET 0)
                 AND (o.attempt < o.max_attempts OR c.state = 'pause_requested' OR c.state = 'resumed'
                      OR EXISTS (SELECT 1 FROM {scheduler_occurrence_retries} AS r
                                 WHERE r.occurrence_id = o.occurrence_id AND r.claimed_at IS NULL
                                   AND r.expected_fence = o.fence))
                 AND (c.state IS NULL OR c.state <> 'paused')))
     ORDER BY o.lease_expires_at, o.occurrence_id
     LIMIT 1)
),
probe AS MATERIALIZED (  -- the heads with their checks as columns
    SELECT h.arm, o.occurrence_id, o.job_id, o.job_revision, o.idempotency_key, o.trigger_key,
           o.scheduled_for, o.available_at, o.status, o.attempt, o.max_attempts, o.fence,
           o.lease_owner, o.lease_expires_at, o.authority_json, o.payload_json,
           o.last_error_json, o.result_json, o.created_at, o.updated_at, o.settled_at,
           c.state AS control_state, c.expected_fence AS control_expected_fence,
           (SELECT min(r.request_id)  -- the first pending requeue request by (created_at, request_id)
            FROM {scheduler_occurrence_retries} AS r
            WHERE r.occurrence_id = o.occurrence_id AND r.claimed_at IS NULL AND r.expected_fence = o.fence
              AND r.created_at = (SELECT min(f.created_at) FROM {scheduler_occurrence_retries} AS f
                                  WHERE f.occurrence_id = o.occurrence_id AND f.claimed_at IS NULL
                                    AND f.expected_fence = o.fence)) AS retry_request_id,
           EXISTS (SELECT 1 FROM {jobs} AS j
                   WHERE j.job_id = o.job_id AND j.enabled = 1
                     AND (CAST(:job_kinds AS text[]) IS NULL OR j.kind = ANY (CAST(:job_kinds AS text[])))
                     AND (CAST(:workspace_id AS text) IS NULL
                          OR CAST(j.authority_json AS json) ->> 'workspaceId' = CAST(:workspace_id AS text))
                   OFFSET 0) AS job_ok,
           CASE WHEN h.arm = 'e' THEN
               (SELECT a.request_id FROM {scheduler_occurrence_adjudications} AS a
                WHERE a.occurrence_id = o.occurrence_id AND a.status = 'pending')
           END AS adjudication_request_id
    FROM heads AS h
    JOIN {occurrences} AS o ON o.occurrence_id = h.occurrence_id
    LEFT JOIN {scheduler_occurrence_controls} AS c ON c.occurrence_id = o.occurrence_id
),
head AS (  -- the earliest due head, when nothing expired is to be acted on
    SELECT occurrence_id,
           job_ok AND control_state IS NULL AND retry_request_id IS NULL AND attempt < max_attempts AS plain
    FROM probe
    WHERE arm <> 'e' AND NOT EXISTS (SELECT 1 FROM probe WHERE arm = 'e')
    ORDER BY available_at, scheduled_for, occurrence_id
    LIMIT 1
),
locked AS MATERIALIZED (  -- that head, if plain, as locked
    SELECT o.occurrence_id, o.job_id, o.job_revision, o.idempotency_key, o.trigger_key,
           o.scheduled_for, o.available_at, o.status, o.attempt, o.max_attempts, o.fence,
           o.lease_owner, o.lease_expires_at, o.authority_json, o.payload_json,
           o.last_error_json, o.result_json, o.created_at, o.updated_at, o.settled_at
    FROM {occurrences} AS o
    JOIN head ON head.occurrence_id = o.occurrence_id
    WHERE head.plain
    FOR UPDATE OF o SKIP LOCKED
)
SELECT p.arm, p.occurrence_id, p.job_id, p.job_revision, p.idempotency_key, p.trigger_key,
       p.scheduled_for, p.available_at, p.status, p.attempt, p.max_attempts, p.fence,
       p.lease_owner, p.lease_expires_at, p.authority_json, p.payload_json, p.last_error_json,
       p.result_json, p.created_at, p.updated_at, p.settled_at,
       p.control_state, p.control_expected_fence, p.retry_request_id, p.job_ok,
       p.adjudication_request_id,
       l.occurrence_id AS locked_occurrence_id, l.job_id AS locked_job_id,
       l.job_revision AS locked_job_revision, l.idempotency_key AS locked_idempotency_key,
       l.trigger_key AS locked_trigger_key, l.scheduled_for AS locked_scheduled_for,
       l.available_at AS locked_available_at, l.status AS locked_status,
       l.attempt AS locked_attempt, l.max_attempts AS locked_max_attempts, l.fence AS locked_fence,
       l.lease_owner AS locked_lease_owner, l.lease_expires_at AS locked_lease_expires_at,
       l.authority_json AS locked_authority_json, l.payload_json AS locked_payload_json,
       l.last_error_json AS locked_last_error_json, l.result_json AS locked_result_json,
       l.created_at AS locked_created_at, l.updated_at AS locked_updated_at,
       l.settled_at AS locked_settled_at,
       (SELECT plain FROM head) AS head_plain
FROM probe AS p
LEFT JOIN locked AS l ON l.occurrence_id = p.occurrence_id


-- name: cycle_read
-- A quiet cycle's first statement: the settled row locked, the clock read after that lock, the
-- first due row of each waiting status and one expired lease the call could act on, and the
-- earliest head locked SKIP LOCKED if a claim may take it on its probed row alone.
WITH cycle_started AS MATERIALIZED (
    SELECT clock_timestamp() AS at
),
locked_current AS MATERIALIZED (
    SELECT o.occurrence_id, o.job_id, o.job_revision, o.idempotency_key, o.trigger_key,
           o.scheduled_for, o.available_at, o.status, o.attempt, o.max_attempts, o.fence,
           o.lease_owner, o.lease_expires_at, o.authority_json, o.payload_json,
           o.last_error_json, o.result_json, o.created_at, o.updated_at, o.settled_at,
           c.state AS control_state, c.expected_fence AS control_expected_fence,
           res.status AS reservation_status, res.policy_revision AS reservation_policy_revision,
           res.units AS reservation_units,
           adj.status AS adjudication_status, adj.request_id AS adjudication_request_id,
           o.xmin::text AS row_version
    FROM {occurrences} AS o
    LEFT JOIN {scheduler_occurrence_controls} AS c ON c.occurrence_id = o.occurrence_id
    LEFT JOIN {scheduler_authority_reservations} AS res ON res.occurrence_id = o.occurrence_id
    LEFT JOIN {scheduler_occurrence_adjudications} AS adj ON adj.occurrence_id = o.occurrence_id
    WHERE o.occurrence_id = :p_id
      AND (SELECT at FROM cycle_started) IS NOT NULL
    FOR UPDATE OF o
),
cycle_clock AS MATERIALIZED (  -- read after the lock: it depends on locked_current
    SELECT coalesce(CAST(:now AS bigint), floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) AS now,
           floor(extract(epoch FROM clock_timestamp() - (SELECT at FROM cycle_started)) * 1000000)::bigint
               AS waited_us
    FROM (SELECT count(*) FROM locked_current) AS current_locked
),
heads AS (
    (SELECT 'q' AS arm, occurrence_id
     FROM {occurrences}
     WHERE status = 'queued' AND available_at <= (SELECT now FROM cycle_clock)
     ORDER BY available_at, lease_expires_at, scheduled_for, occurrence_id
     LIMIT 1)
    UNION ALL
    (SELECT 'r', occurrence_id
     FROM {occurrences}
     WHERE status = 'retry_wait' AND available_at <= (SELECT now FROM cycle_clock)
     ORDER BY available_at, lease_expires_at, scheduled_for, occurrence_id
     LIMIT 1)
    UNION ALL
    (SELECT 'e', o.occurrence_id  -- an expired lease to sweep, or to claim again
     FROM {occurrences} AS o
     LEFT JOIN {scheduler_occurrence_controls} AS c ON c.occurrence_id = o.occurrence_id
     WHERE o.status = 'running' AND o.lease_expires_at <= (SELECT now FROM cycle_clock)
       AND (    (o.attempt >= o.max_attempts
                 AND (c.state IS NULL OR (c.state <> 'pause_requested' AND c.state <> 'resumed')))
            OR  (EXISTS (SELECT 1 FROM {jobs} AS j
                         WHERE j.job_id = o.job_id AND j.enabled = 1
                           AND (CAST(:job_kinds AS text[]) IS NULL OR j.kind = ANY (CAST(:job_kinds AS text[])))
                           AND (CAST(:workspace_id AS text) IS NULL
                                OR CAST(j.authority_json AS json) ->> 'workspaceId' = CAST(:workspace_id AS text))
                         OFFSET 0)
                 AND (o.attempt < o.max_attempts OR c.state = 'pause_requested' OR c.state = 'resumed'
                      OR EXISTS (SELECT 1 FROM {scheduler_occurrence_retries} AS r
                                 WHERE r.occurrence_id = o.occurrence_id AND r.claimed_at IS NULL
                                   AND r.expected_fence = o.fence))
                 AND (c.state IS NULL OR c.state <> 'paused')))
     ORDER BY o.lease_expires_at, o.occurrence_id
     LIMIT 1)
),
probe AS MATERIALIZED (  -- the heads with their checks as columns
    SELECT h.arm, o.occurrence_id, o.job_id, o.job_revision, o.idempotency_key, o.trigger_key,
           o.scheduled_for, o.available_at, o.status, o.attempt, o.max_attempts, o.fence,
           o.lease_owner, o.lease_expires_at, o.authority_json, o.payload_json,
           o.last_error_json, o.result_json, o.created_at, o.updated_at, o.settled_at,
           c.state AS control_state, c.expected_fence AS control_expected_fence,
           (SELECT min(r.request_id)  -- the first pending requeue request by (created_at, request_id)
            FROM {scheduler_occurrence_retries} AS r
            WHERE r.occurrence_id = o.occurrence_id AND r.claimed_at IS NULL AND r.expected_fence = o.fence
              AND r.created_at = (SELECT min(f.created_at) FROM {scheduler_occurrence_retries} AS f
                                  WHERE f.occurrence_id = o.occurrence_id AND f.claimed_at IS NULL
                                    AND f.expected_fence = o.fence)) AS retry_request_id,
           EXISTS (SELECT 1 FROM {jobs} AS j
                   WHERE j.job_id = o.job_id AND j.enabled = 1
                     AND (CAST(:job_kinds AS text[]) IS NULL OR j.kind = ANY (CAST(:job_kinds AS text[])))
                     AND (CAST(:workspace_id AS text) IS NULL
                          OR CAST(j.authority_json AS json) ->> 'workspaceId' = CAST(:workspace_id AS text))
                   OFFSET 0) AS job_ok,
           CASE WHEN h.arm = 'e' THEN
               (SELECT a.request_id FROM {scheduler_occurrence_adjudications} AS a
                WHERE a.occurrence_id = o.occurrence_id AND a.status = 'pending')
           END AS adjudication_request_id
    FROM heads AS h
    JOIN {occurrences} AS o ON o.occurrence_id = h.occurrence_id
    LEFT JOIN {scheduler_occurrence_controls} AS c ON c.occurrence_id = o.occurrence_id
),
head AS (  -- the earliest due head, when nothing expired is to be acted on
    SELECT occurrence_id,
           job_ok AND control_state IS NULL AND retry_request_id IS NULL AND attempt < max_attempts AS plain
    FROM probe
    WHERE arm <> 'e' AND NOT EXISTS (SELECT 1 FROM probe WHERE arm = 'e')
    ORDER BY available_at, scheduled_for, occurrence_id
    LIMIT 1
),
locked AS MATERIALIZED (  -- that head, if plain and the settlement holds its lease, as locked
    SELECT o.occurrence_id, o.job_id, o.job_revision, o.idempotency_key, o.trigger_key,
           o.scheduled_for, o.available_at, o.status, o.attempt, o.max_attempts, o.fence,
           o.lease_owner, o.lease_expires_at, o.authority_json, o.payload_json,
           o.last_error_json, o.result_json, o.created_at, o.updated_at, o.settled_at
    FROM {occurrences} AS o
    JOIN head ON head.occurrence_id = o.occurrence_id
    WHERE head.plain
      AND EXISTS (SELECT 1 FROM locked_current AS lc
                  WHERE lc.status = 'running' AND lc.lease_owner = :p_owner
                    AND lc.fence = CAST(:p_fence AS bigint)
                    AND lc.lease_expires_at > (SELECT now FROM cycle_clock))
    FOR UPDATE OF o SKIP LOCKED
)
SELECT lc.occurrence_id AS settled_occurrence_id, lc.job_id AS settled_job_id,
       lc.job_revision AS settled_job_revision, lc.idempotency_key AS settled_idempotency_key,
       lc.trigger_key AS settled_trigger_key, lc.scheduled_for AS settled_scheduled_for,
       lc.available_at AS settled_available_at, lc.status AS settled_status,
       lc.attempt AS settled_attempt, lc.max_attempts AS settled_max_attempts,
       lc.fence AS settled_fence, lc.lease_owner AS settled_lease_owner,
       lc.lease_expires_at AS settled_lease_expires_at, lc.authority_json AS settled_authority_json,
       lc.payload_json AS settled_payload_json, lc.last_error_json AS settled_last_error_json,
       lc.result_json AS settled_result_json, lc.created_at AS settled_created_at,
       lc.updated_at AS settled_updated_at, lc.settled_at AS settled_settled_at,
       lc.control_state AS settled_control_state,
       lc.control_expected_fence AS settled_control_expected_fence,
       lc.reservation_status AS settled_reservation_status,
       lc.reservation_policy_revision AS settled_reservation_policy_revision,
       lc.reservation_units AS settled_reservation_units,
       lc.adjudication_status AS settled_adjudication_status,
       lc.adjudication_request_id AS settled_adjudication_request_id,
       lc.row_version AS settled_row_version,
       (SELECT as_read.xmin::text FROM {occurrences} AS as_read
        WHERE as_read.occurrence_id = :p_id) AS settled_version_as_read,
       cycle_clock.now AS settled_server_now, cycle_clock.waited_us AS settled_waited_us,
       p.arm, p.occurrence_id, p.job_id, p.job_revision, p.idempotency_key, p.trigger_key,
       p.scheduled_for, p.available_at, p.status, p.attempt, p.max_attempts, p.fence,
       p.lease_owner, p.lease_expires_at, p.authority_json, p.payload_json, p.last_error_json,
       p.result_json, p.created_at, p.updated_at, p.settled_at,
       p.control_state, p.control_expected_fence, p.retry_request_id, p.job_ok,
       p.adjudication_request_id,
       l.occurrence_id AS locked_occurrence_id, l.job_id AS locked_job_id,
       l.job_revision AS locked_job_revision, l.idempotency_key AS locked_idempotency_key,
       l.trigger_key AS locked_trigger_key, l.scheduled_for AS locked_scheduled_for,
       l.available_at AS locked_available_at, l.status AS locked_status,
       l.attempt AS locked_attempt, l.max_attempts AS locked_max_attempts, l.fence AS locked_fence,
       l.lease_owner AS locked_lease_owner, l.lease_expires_at AS locked_lease_expires_at,
       l.authority_json AS locked_authority_json, l.payload_json AS locked_payload_json,
       l.last_error_json AS locked_last_error_json, l.result_json AS locked_result_json,
       l.created_at AS locked_created_at, l.updated_at AS locked_updated_at,
       l.settled_at AS locked_settled_at,
       (SELECT plain FROM head) AS head_plain
FROM locked_current AS lc
CROSS JOIN cycle_clock
LEFT JOIN (probe AS p LEFT JOIN locked AS l ON l.occurrence_id = p.occurrence_id) ON true


-- name: cycle_read_window
-- cycle_read among workers that hold the first candidates: the first 8 due rows of each waiting
-- status (claim_query.HEAD_WINDOW) and one expired lease, none of them locked (the call locks
-- its candidate in a statement of its own, on a newer snapshot).
WITH cycle_started AS MATERIALIZED (
    SELECT clock_timestamp() AS at
),
locked_current AS MATERIALIZED (
    SELECT o.occurrence_id, o.job_id, o.job_revision, o.idempotency_key, o.trigger_key,
           o.scheduled_for, o.available_at, o.status, o.attempt, o.max_attempts, o.fence,
           o.lease_owner, o.lease_expires_at, o.authority_json, o.payload_json,
           o.last_error_json, o.result_json, o.created_at, o.updated_at, o.settled_at,
           c.state AS control_state, c.expected_fence AS control_expected_fence,
           res.status AS reservation_status, res.policy_revision AS reservation_policy_revision,
           res.units AS reservation_units,
           adj.status AS adjudication_status, adj.request_id AS adjudication_request_id,
           o.xmin::text AS row_version
    FROM {occurrences} AS o
    LEFT JOIN {scheduler_occurrence_controls} AS c ON c.occurrence_id = o.occurrence_id
    LEFT JOIN {scheduler_authority_reservations} AS res ON res.occurrence_id = o.occurrence_id
    LEFT JOIN {scheduler_occurrence_adjudications} AS adj ON adj.occurrence_id = o.occurrence_id
    WHERE o.occurrence_id = :p_id
      AND (SELECT at FROM cycle_started) IS NOT NULL
    FOR UPDATE OF o
),
cycle_clock AS MATERIALIZED (
    SELECT coalesce(CAST(:now AS bigint), floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) AS now,
           floor(extract(epoch FROM clock_timestamp() - (SELECT at FROM cycle_started)) * 1000000)::bigint
               AS waited_us
    FROM (SELECT count(*) FROM locked_current) AS current_locked
),
heads AS (
    (SELECT 'q' AS arm, occurrence_id
     FROM {occurrences}
     WHERE status = 'queued' AND available_at <= (SELECT now FROM cycle_clock)
     ORDER BY available_at, lease_expires_at, scheduled_for, occurrence_id
     LIMIT 8)
    UNION ALL
    (SELECT 'r', occurrence_id
     FROM {occurrences}
     WHERE status = 'retry_wait' AND available_at <= (SELECT now FROM cycle_clock)
     ORDER BY available_at, lease_expires_at, scheduled_for, occurrence_id
     LIMIT 8)
    UNION ALL
    (SELECT 'e', o.occurrence_id
     FROM {occurrences} AS o
     LEFT JOIN {scheduler_occurrence_controls} AS c ON c.occurrence_id = o.occurrence_id
     WHERE o.status = 'running' AND o.lease_expires_at <= (SELECT now FROM cycle_clock)
       AND (    (o.attempt >= o.max_attempts
                 AND (c.state IS NULL OR (c.state <> 'pause_requested' AND c.state <> 'resumed')))
            OR  (EXISTS (SELECT 1 FROM {jobs} AS j
                         WHERE j.job_id = o.job_id AND j.enabled = 1
                           AND (CAST(:job_kinds AS text[]) IS NULL OR j.kind = ANY (CAST(:job_kinds AS text[])))
                           AND (CAST(:workspace_id AS text) IS NULL
                                OR CAST(j.authority_json AS json) ->> 'workspaceId' = CAST(:workspace_id AS text))
                         OFFSET 0)
                 AND (o.attempt < o.max_attempts OR c.state = 'pause_requested' OR c.state = 'resumed'
                      OR EXISTS (SELECT 1 FROM {scheduler_occurrence_retries} AS r
                                 WHERE r.occurrence_id = o.occurrence_id AND r.claimed_at IS NULL
                                   AND r.expected_fence = o.fence))
                 AND (c.state IS NULL OR c.state <> 'paused')))
     ORDER BY o.lease_expires_at, o.occurrence_id
     LIMIT 1)
)
SELECT lc.occurrence_id AS settled_occurrence_id, lc.job_id AS settled_job_id,
       lc.job_revision AS settled_job_revision, lc.idempotency_key AS settled_idempotency_key,
       lc.trigger_key AS settled_trigger_key, lc.scheduled_for AS settled_scheduled_for,
       lc.available_at AS settled_available_at, lc.status AS settled_status,
       lc.attempt AS settled_attempt, lc.max_attempts AS settled_max_attempts,
       lc.fence AS settled_fence, lc.lease_owner AS settled_lease_owner,
       lc.lease_expires_at AS settled_lease_expires_at, lc.authority_json AS settled_authority_json,
       lc.payload_json AS settled_payload_json, lc.last_error_json AS settled_last_error_json,
       lc.result_json AS settled_result_json, lc.created_at AS settled_created_at,
       lc.updated_at AS settled_updated_at, lc.settled_at AS settled_settled_at,
       lc.control_state AS settled_control_state,
       lc.control_expected_fence AS settled_control_expected_fence,
       lc.reservation_status AS settled_reservation_status,
       lc.reservation_policy_revision AS settled_reservation_policy_revision,
       lc.reservation_units AS settled_reservation_units,
       lc.adjudication_status AS settled_adjudication_status,
       lc.adjudication_request_id AS settled_adjudication_request_id,
       lc.row_version AS settled_row_version,
       (SELECT as_read.xmin::text FROM {occurrences} AS as_read
        WHERE as_read.occurrence_id = :p_id) AS settled_version_as_read,
       cycle_clock.now AS settled_server_now, cycle_clock.waited_us AS settled_waited_us,
       p.arm, p.occurrence_id, p.job_id, p.job_revision, p.idempotency_key, p.trigger_key,
       p.scheduled_for, p.available_at, p.status, p.attempt, p.max_attempts, p.fence,
       p.lease_owner, p.lease_expires_at, p.authority_json, p.payload_json, p.last_error_json,
       p.result_json, p.created_at, p.updated_at, p.settled_at,
       p.control_state, p.control_expected_fence, p.retry_request_id, p.job_ok,
       p.adjudication_request_id
FROM locked_current AS lc
CROSS JOIN cycle_clock
LEFT JOIN (
    SELECT h.arm, o.occurrence_id, o.job_id, o.job_revision, o.idempotency_key, o.trigger_key,
           o.scheduled_for, o.available_at, o.status, o.attempt, o.max_attempts, o.fence,
           o.lease_owner, o.lease_expires_at, o.authority_json, o.payload_json,
           o.last_error_json, o.result_json, o.created_at, o.updated_at, o.settled_at,
           c.state AS control_state, c.expected_fence AS control_expected_fence,
           (SELECT min(r.request_id)
            FROM {scheduler_occurrence_retries} AS r
            WHERE r.occurrence_id = o.occurrence_id AND r.claimed_at IS NULL AND r.expected_fence = o.fence
              AND r.created_at = (SELECT min(f.created_at) FROM {scheduler_occurrence_retries} AS f
                                  WHERE f.occurrence_id = o.occurrence_id AND f.claimed_at IS NULL
                                    AND f.expected_fence = o.fence)) AS retry_request_id,
           EXISTS (SELECT 1 FROM {jobs} AS j
                   WHERE j.job_id = o.job_id AND j.enabled = 1
                     AND (CAST(:job_kinds AS text[]) IS NULL OR j.kind = ANY (CAST(:job_kinds AS text[])))
                     AND (CAST(:workspace_id AS text) IS NULL
                          OR CAST(j.authority_json AS json) ->> 'workspaceId' = CAST(:workspace_id AS text))
                   OFFSET 0) AS job_ok,
           CASE WHEN h.arm = 'e' THEN
               (SELECT a.request_id FROM {scheduler_occurrence_adjudications} AS a
                WHERE a.occurrence_id = o.occurrence_id AND a.status = 'pending')
           END AS adjudication_request_id
    FROM heads AS h
    JOIN {occurrences} AS o ON o.occurrence_id = h.occurrence_id
    LEFT JOIN {scheduler_occurrence_controls} AS c ON c.occurrence_id = o.occurrence_id
) AS p ON true


-- name: cycle
-- A successful settle_and_claim in one statement, sent with BEGIN and COMMIT in one round trip
-- after a lead statement that locks the settled row. It settles the row as succeeded and claims
-- the earliest head if that head is plain and was locked as probed; the first column fails the
-- statement (and the COMMIT with it) unless the settlement wrote its row and either the head was
-- claimed or nothing is due: the call then runs again the usual way.
WITH cycle_started AS MATERIALIZED (
    SELECT clock_timestamp() AS at
),
locked_current AS MATERIALIZED (
    SELECT o.occurrence_id, o.status, o.lease_owner, o.fence, o.lease_expires_at,
           c.state AS control_state, res.status AS reservation_status, adj.status AS adjudication_status,
           o.xmin::text AS row_version
    FROM {occurrences} AS o
    LEFT JOIN {scheduler_occurrence_controls} AS c ON c.occurrence_id = o.occurrence_id
    LEFT JOIN {scheduler_authority_reservations} AS res ON res.occurrence_id = o.occurrence_id
    LEFT JOIN {scheduler_occurrence_adjudications} AS adj ON adj.occurrence_id = o.occurrence_id
    WHERE o.occurrence_id = :p_id
      AND (SELECT at FROM cycle_started) IS NOT NULL
    FOR UPDATE OF o
),
cycle_clock AS MATERIALIZED (
    SELECT coalesce(CAST(:now AS bigint), floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) AS now,
           floor(extract(epoch FROM clock_timestamp() - (SELECT at FROM cycle_started)) * 1000000)::bigint
               AS waited_us
    FROM (SELECT count(*) FROM locked_current) AS current_locked
),
settled AS (  -- the settlement's guarded UPDATE for a success
    UPDATE {occurrences} AS o
    SET status = 'succeeded', lease_owner = NULL, lease_expires_at = NULL, last_error_json = NULL,
        result_json = :p_result,
        updated_at = (SELECT now FROM cycle_clock), settled_at = (SELECT now FROM cycle_clock)
    FROM locked_current AS lc
    WHERE o.occurrence_id = :p_id
      AND (o.status = 'running') IS TRUE
      AND o.lease_owner = :p_owner AND o.fence = CAST(:p_fence AS bigint)
      AND o.lease_expires_at > (SELECT now FROM cycle_clock)
      AND NOT EXISTS (SELECT 1 FROM {scheduler_occurrence_controls} AS c WHERE c.occurrence_id = o.occurrence_id)
      AND NOT EXISTS (SELECT 1 FROM {scheduler_authority_reservations} AS res WHERE res.occurrence_id = o.occurrence_id)
      AND NOT EXISTS (SELECT 1 FROM {scheduler_occurrence_adjudications} AS adj WHERE adj.occurrence_id = o.occurrence_id)
      -- read without a control, reservation or adjudication, as the version the snapshot reads,
      -- and without a long lock wait
      AND lc.occurrence_id = o.occurrence_id
      AND lc.control_state IS NULL AND lc.reservation_status IS NULL AND lc.adjudication_status IS NULL
      AND lc.row_version = (SELECT as_read.xmin::text FROM {occurrences} AS as_read
                            WHERE as_read.occurrence_id = :p_id)
      AND (SELECT waited_us FROM cycle_clock) <= 2000
    RETURNING o.*
),
heads AS (
    (SELECT 'q' AS arm, occurrence_id
     FROM {occurrences}
     WHERE status = 'queued' AND available_at <= (SELECT now FROM cycle_clock)
     ORDER BY available_at, lease_expires_at, scheduled_for, occurrence_id
     LIMIT 1)
    UNION ALL
    (SELECT 'r', occurrence_id
     FROM {occurrences}
     WHERE status = 'retry_wait' AND available_at <= (SELECT now FROM cycle_clock)
     ORDER BY available_at, lease_expires_at, scheduled_for, occurrence_id
     LIMIT 1)
    UNION ALL
    (SELECT 'e', o.occurrence_id
     FROM {occurrences} AS o
     LEFT JOIN {scheduler_occurrence_controls} AS c ON c.occurrence_id = o.occurrence_id
     WHERE o.status = 'running' AND o.lease_expires_at <= (SELECT now FROM cycle_clock)
       AND (    (o.attempt >= o.max_attempts
                 AND (c.state IS NULL OR (c.state <> 'pause_requested' AND c.state <> 'resumed')))
            OR  (EXISTS (SELECT 1 FROM {jobs} AS j
                         WHERE j.job_id = o.job_id AND j.enabled = 1
                           AND (CAST(:job_kinds AS text[]) IS NULL OR j.kind = ANY (CAST(:job_kinds AS text[])))
                           AND (CAST(:workspace_id AS text) IS NULL
                                OR CAST(j.authority_json AS json) ->> 'workspaceId' = CAST(:workspace_id AS text))
                         OFFSET 0)
                 AND (o.attempt < o.max_attempts OR c.state = 'pause_requested' OR c.state = 'resumed'
                      OR EXISTS (SELECT 1 FROM {scheduler_occurrence_retries} AS r
                                 WHERE r.occurrence_id = o.occurrence_id AND r.claimed_at IS NULL
                                   AND r.expected_fence = o.fence))
                 AND (c.state IS NULL OR c.state <> 'paused')))
     ORDER BY o.lease_expires_at, o.occurrence_id
     LIMIT 1)
),
probe AS MATERIALIZED (  -- what the statement reads of its heads
    SELECT h.arm, o.occurrence_id, o.status, o.attempt, o.max_attempts, o.fence, o.available_at,
           o.scheduled_for, c.state AS control_state,
           (SELECT r.request_id FROM {scheduler_occurrence_retries} AS r
            WHERE r.occurrence_id = o.occurrence_id AND r.claimed_at IS NULL AND r.expected_fence = o.fence
            LIMIT 1) AS retry_request_id,
           EXISTS (SELECT 1 FROM {jobs} AS j
                   WHERE j.job_id = o.job_id AND j.enabled = 1
                     AND (CAST(:job_kinds AS text[]) IS NULL OR j.kind = ANY (CAST(:job_kinds AS text[])))
                     AND (CAST(:workspace_id AS text) IS NULL
                          OR CAST(j.authority_json AS json) ->> 'workspaceId' = CAST(:workspace_id AS text))
                   OFFSET 0) AS job_ok
    FROM heads AS h
    JOIN {occurrences} AS o ON o.occurrence_id = h.occurrence_id
    LEFT JOIN {scheduler_occurrence_controls} AS c ON c.occurrence_id = o.occurrence_id
),
head AS (
    SELECT occurrence_id,
           job_ok AND control_state IS NULL AND retry_request_id IS NULL AND attempt < max_attempts AS plain
    FROM probe
    WHERE arm <> 'e' AND NOT EXISTS (SELECT 1 FROM probe WHERE arm = 'e')
    ORDER BY available_at, scheduled_for, occurrence_id
    LIMIT 1
),
locked AS MATERIALIZED (
    SELECT o.occurrence_id, o.fence, o.status, 1 AS position
    FROM {occurrences} AS o
    JOIN head ON head.occurrence_id = o.occurrence_id
    WHERE head.plain
      AND EXISTS (SELECT 1 FROM locked_current AS lc
                  WHERE lc.status = 'running' AND lc.lease_owner = :p_owner
                    AND lc.fence = CAST(:p_fence AS bigint)
                    AND lc.lease_expires_at > (SELECT now FROM cycle_clock))
    FOR UPDATE OF o SKIP LOCKED
),
claimed AS (  -- the claim's guarded UPDATE of the locked head, at its version as probed
    UPDATE {occurrences} AS o
    SET status = 'running', attempt = o.attempt + 1, fence = o.fence + 1, lease_owner = :p_owner,
        lease_expires_at = (SELECT now FROM cycle_clock) + CAST(:p_lease AS bigint),
        updated_at = (SELECT now FROM cycle_clock), settled_at = NULL
    FROM locked
    WHERE o.occurrence_id = locked.occurrence_id AND o.fence = locked.fence
      AND NOT EXISTS (SELECT 1 FROM {scheduler_occurrence_controls} AS c WHERE c.occurrence_id = o.occurrence_id)
      AND NOT EXISTS (SELECT 1 FROM {scheduler_occurrence_retries} AS r
                      WHERE r.occurrence_id = o.occurrence_id AND r.claimed_at IS NULL
                        AND r.expected_fence = o.fence)
      AND EXISTS (SELECT 1 FROM {jobs} AS j WHERE j.job_id = o.job_id AND j.enabled = 1)
      AND (o.occurrence_id || ':' || o.fence || ':' || o.status || ':' || o.attempt || ':'
           || o.available_at || ':' || o.scheduled_for)
          = (SELECT p.occurrence_id || ':' || p.fence || ':' || p.status || ':' || p.attempt || ':'
                    || p.available_at || ':' || p.scheduled_for
             FROM probe AS p WHERE p.occurrence_id = locked.occurrence_id)
      AND o.lease_owner IS NULL
      AND (SELECT now FROM cycle_clock) + CAST(:p_lease AS bigint) <= 9007199254740991
    RETURNING o.*, locked.status AS previous_status, locked.position
),
ev AS (
    INSERT INTO {events} (job_id, occurrence_id, event_type, occurred_at, owner_id, fence, data_json)
    SELECT job_id, occurrence_id, 'occurrence_succeeded', (SELECT now FROM cycle_clock),
           CAST(:p_owner AS varchar), fence,
           '{"attempt":' || attempt || ',"maxAttempts":' || max_attempts || '}'
    FROM settled
    UNION ALL
    SELECT job_id, occurrence_id, 'occurrence_claimed', (SELECT now FROM cycle_clock),
           CAST(:p_owner AS varchar), fence,
           '{"attempt":' || attempt || ',"previousOwner":' || 'null' || ',"previousStatus":"' || previous_status || '"}'
    FROM claimed
    RETURNING 1
)
SELECT CAST(CASE WHEN (SELECT count(*) FROM settled) = 1
                  AND ((SELECT count(*) FROM claimed) = 1 OR (SELECT count(*) FROM probe) = 0)
                  AND (SELECT count(*) FROM ev) = 1 + (SELECT count(*) FROM claimed)
                  AND (SELECT now FROM cycle_clock) + CAST(:p_lease AS bigint) <= 9007199254740991
                 THEN '1' ELSE 'scheduler:kept-writes-changed' END AS integer) AS checked,
       cycle_clock.now AS server_now,
       s.occurrence_id AS s_occurrence_id, s.job_id AS s_job_id, s.job_revision AS s_job_revision,
       s.idempotency_key AS s_idempotency_key, s.trigger_key AS s_trigger_key,
       s.scheduled_for AS s_scheduled_for, s.available_at AS s_available_at, s.status AS s_status,
       s.attempt AS s_attempt, s.max_attempts AS s_max_attempts, s.fence AS s_fence,
       s.lease_owner AS s_lease_owner, s.lease_expires_at AS s_lease_expires_at,
       s.authority_json AS s_authority_json, s.payload_json AS s_payload_json,
       s.last_error_json AS s_last_error_json, s.result_json AS s_result_json,
       s.created_at AS s_created_at, s.updated_at AS s_updated_at, s.settled_at AS s_settled_at,
       cl.occurrence_id AS c_occurrence_id, cl.job_id AS c_job_id, cl.job_revision AS c_job_revision,
       cl.idempotency_key AS c_idempotency_key, cl.trigger_key AS c_trigger_key,
       cl.scheduled_for AS c_scheduled_for, cl.available_at AS c_available_at, cl.status AS c_status,
       cl.attempt AS c_attempt, cl.max_attempts AS c_max_attempts, cl.fence AS c_fence,
       cl.lease_owner AS c_lease_owner, cl.lease_expires_at AS c_lease_expires_at,
       cl.authority_json AS c_authority_json, cl.payload_json AS c_payload_json,
       cl.last_error_json AS c_last_error_json, cl.result_json AS c_result_json,
       cl.created_at AS c_created_at, cl.updated_at AS c_updated_at, cl.settled_at AS c_settled_at,
       cl.previous_status AS c_previous_status, cl.position AS c_position
FROM cycle_clock
LEFT JOIN settled AS s ON true
LEFT JOIN claimed AS cl ON true


-- name: cycle_window
-- The cycle among workers that hold the first candidates: the window of heads (the first 8 due
-- rows of each waiting status, as cycle_read_window reads them) ranked in the seed's order, cut
-- before the first row that is not plain and after the last row of an arm that may hold unread
-- rows; the first free candidate is locked SKIP LOCKED at its version as read (PostgreSQL checks
-- the version again on the row it locks, and LIMIT 1 then takes the next). c_position tells the
-- caller whether the first candidate was free.
WITH cycle_started AS MATERIALIZED (
    SELECT clock_timestamp() AS at
),
locked_current AS MATERIALIZED (
    SELECT o.occurrence_id, o.status, o.lease_owner, o.fence, o.lease_expires_at,
           c.state AS control_state, res.status AS reservation_status, adj.status AS adjudication_status,
           o.xmin::text AS row_version
    FROM {occurrences} AS o
    LEFT JOIN {scheduler_occurrence_controls} AS c ON c.occurrence_id = o.occurrence_id
    LEFT JOIN {scheduler_authority_reservations} AS res ON res.occurrence_id = o.occurrence_id
    LEFT JOIN {scheduler_occurrence_adjudications} AS adj ON adj.occurrence_id = o.occurrence_id
    WHERE o.occurrence_id = :p_id
      AND (SELECT at FROM cycle_started) IS NOT NULL
    FOR UPDATE OF o
),
cycle_clock AS MATERIALIZED (
    SELECT coalesce(CAST(:now AS bigint), floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) AS now,
           floor(extract(epoch FROM clock_timestamp() - (SELECT at FROM cycle_started)) * 1000000)::bigint
               AS waited_us
    FROM (SELECT count(*) FROM locked_current) AS current_locked
),
settled AS (
    UPDATE {occurrences} AS o
    SET status = 'succeeded', lease_owner = NULL, lease_expires_at = NULL, last_error_json = NULL,
        result_json = :p_result,
        updated_at = (SELECT now FROM cycle_clock), settled_at = (SELECT now FROM cycle_clock)
    FROM locked_current AS lc
    WHERE o.occurrence_id = :p_id
      AND (o.status = 'running') IS TRUE
      AND o.lease_owner = :p_owner AND o.fence = CAST(:p_fence AS bigint)
      AND o.lease_expires_at > (SELECT now FROM cycle_clock)
      AND NOT EXISTS (SELECT 1 FROM {scheduler_occurrence_controls} AS c WHERE c.occurrence_id = o.occurrence_id)
      AND NOT EXISTS (SELECT 1 FROM {scheduler_authority_reservations} AS res WHERE res.occurrence_id = o.occurrence_id)
      AND NOT EXISTS (SELECT 1 FROM {scheduler_occurrence_adjudications} AS adj WHERE adj.occurrence_id = o.occurrence_id)
      AND lc.occurrence_id = o.occurrence_id
      AND lc.control_state IS NULL AND lc.reservation_status IS NULL AND lc.adjudication_status IS NULL
      AND lc.row_version = (SELECT as_read.xmin::text FROM {occurrences} AS as_read
                            WHERE as_read.occurrence_id = :p_id)
      AND (SELECT waited_us FROM cycle_clock) <= 2000
    RETURNING o.*
),
heads AS (
    (SELECT 'q' AS arm, occurrence_id
     FROM {occurrences}
     WHERE status = 'queued' AND available_at <= (SELECT now FROM cycle_clock)
     ORDER BY available_at, lease_expires_at, scheduled_for, occurrence_id
     LIMIT 8)
    UNION ALL
    (SELECT 'r', occurrence_id
     FROM {occurrences}
     WHERE status = 'retry_wait' AND available_at <= (SELECT now FROM cycle_clock)
     ORDER BY available_at, lease_expires_at, scheduled_for, occurrence_id
     LIMIT 8)
    UNION ALL
    (SELECT 'e', o.occurrence_id
     FROM {occurrences} AS o
     LEFT JOIN {scheduler_occurrence_controls} AS c ON c.occurrence_id = o.occurrence_id
     WHERE o.status = 'running' AND o.lease_expires_at <= (SELECT now FROM cycle_clock)
       AND (    (o.attempt >= o.max_attempts
                 AND (c.state IS NULL OR (c.state <> 'pause_requested' AND c.state <> 'resumed')))
            OR  (EXISTS (SELECT 1 FROM {jobs} AS j
                         WHERE j.job_id = o.job_id AND j.enabled = 1
                           AND (CAST(:job_kinds AS text[]) IS NULL OR j.kind = ANY (CAST(:job_kinds AS text[])))
                           AND (CAST(:workspace_id AS text) IS NULL
                                OR CAST(j.authority_json AS json) ->> 'workspaceId' = CAST(:workspace_id AS text))
                         OFFSET 0)
                 AND (o.attempt < o.max_attempts OR c.state = 'pause_requested' OR c.state = 'resumed'
                      OR EXISTS (SELECT 1 FROM {scheduler_occurrence_retries} AS r
                                 WHERE r.occurrence_id = o.occurrence_id AND r.claimed_at IS NULL
                                   AND r.expected_fence = o.fence))
                 AND (c.state IS NULL OR c.state <> 'paused')))
     ORDER BY o.lease_expires_at, o.occurrence_id
     LIMIT 1)
),
probe AS MATERIALIZED (
    SELECT h.arm, o.occurrence_id, o.status, o.attempt, o.max_attempts, o.fence, o.available_at,
           o.scheduled_for, c.state AS control_state,
           (SELECT r.request_id FROM {scheduler_occurrence_retries} AS r
            WHERE r.occurrence_id = o.occurrence_id AND r.claimed_at IS NULL AND r.expected_fence = o.fence
            LIMIT 1) AS retry_request_id,
           EXISTS (SELECT 1 FROM {jobs} AS j
                   WHERE j.job_id = o.job_id AND j.enabled = 1
                     AND (CAST(:job_kinds AS text[]) IS NULL OR j.kind = ANY (CAST(:job_kinds AS text[])))
                     AND (CAST(:workspace_id AS text) IS NULL
                          OR CAST(j.authority_json AS json) ->> 'workspaceId' = CAST(:workspace_id AS text))
                   OFFSET 0) AS job_ok
    FROM heads AS h
    JOIN {occurrences} AS o ON o.occurrence_id = h.occurrence_id
    LEFT JOIN {scheduler_occurrence_controls} AS c ON c.occurrence_id = o.occurrence_id
),
ranked AS (  -- the window's due rows in the seed's order (none when an expired lease is to be acted on)
    SELECT occurrence_id,
           occurrence_id || ':' || fence || ':' || status || ':' || attempt || ':' || available_at || ':'
               || scheduled_for AS version,
           (job_ok AND control_state IS NULL AND retry_request_id IS NULL AND attempt < max_attempts)
               IS TRUE AS plain,
           row_number() OVER (ORDER BY available_at, scheduled_for, occurrence_id) AS position,
           row_number() OVER (PARTITION BY arm ORDER BY available_at, scheduled_for, occurrence_id) AS arm_rank,
           count(*) OVER (PARTITION BY arm) AS arm_rows
    FROM probe
    WHERE arm <> 'e' AND NOT EXISTS (SELECT 1 FROM probe WHERE arm = 'e')
),
locked AS MATERIALIZED (  -- the first free candidate, locked at its version as read
    SELECT o.occurrence_id, o.fence, o.status, ranked.position
    FROM {occurrences} AS o
    JOIN ranked ON ranked.occurrence_id = o.occurrence_id
    WHERE ranked.plain
      AND ranked.position <= coalesce(
              (SELECT min(CASE WHEN NOT plain THEN position - 1
                               WHEN arm_rows = 8 AND arm_rank = 8 THEN position END)
               FROM ranked),
              ranked.position)
      AND (o.occurrence_id || ':' || o.fence || ':' || o.status || ':' || o.attempt || ':'
           || o.available_at || ':' || o.scheduled_for) = ranked.version
      AND EXISTS (SELECT 1 FROM locked_current AS lc
                  WHERE lc.status = 'running' AND lc.lease_owner = :p_owner
                    AND lc.fence = CAST(:p_fence AS bigint)
                    AND lc.lease_expires_at > (SELECT now FROM cycle_clock))
    ORDER BY ranked.position
    LIMIT 1
    FOR UPDATE OF o SKIP LOCKED
),
claimed AS (
    UPDATE {occurrences} AS o
    SET status = 'running', attempt = o.attempt + 1, fence = o.fence + 1, lease_owner = :p_owner,
        lease_expires_at = (SELECT now FROM cycle_clock) + CAST(:p_lease AS bigint),
        updated_at = (SELECT now FROM cycle_clock), settled_at = NULL
    FROM locked
    WHERE o.occurrence_id = locked.occurrence_id AND o.fence = locked.fence
      AND NOT EXISTS (SELECT 1 FROM {scheduler_occurrence_controls} AS c WHERE c.occurrence_id = o.occurrence_id)
      AND NOT EXISTS (SELECT 1 FROM {scheduler_occurrence_retries} AS r
                      WHERE r.occurrence_id = o.occurrence_id AND r.claimed_at IS NULL
                        AND r.expected_fence = o.fence)
      AND EXISTS (SELECT 1 FROM {jobs} AS j WHERE j.job_id = o.job_id AND j.enabled = 1)
      AND (o.occurrence_id || ':' || o.fence || ':' || o.status || ':' || o.attempt || ':'
           || o.available_at || ':' || o.scheduled_for)
          = (SELECT p.occurrence_id || ':' || p.fence || ':' || p.status || ':' || p.attempt || ':'
                    || p.available_at || ':' || p.scheduled_for
             FROM probe AS p WHERE p.occurrence_id = locked.occurrence_id)
      AND o.lease_owner IS NULL
      AND (SELECT now FROM cycle_clock) + CAST(:p_lease AS bigint) <= 9007199254740991
    RETURNING o.*, locked.status AS previous_status, locked.position
),
ev AS (
    INSERT INTO {events} (job_id, occurrence_id, event_type, occurred_at, owner_id, fence, data_json)
    SELECT job_id, occurrence_id, 'occurrence_succeeded', (SELECT now FROM cycle_clock),
           CAST(:p_owner AS varchar), fence,
           '{"attempt":' || attempt || ',"maxAttempts":' || max_attempts || '}'
    FROM settled
    UNION ALL
    SELECT job_id, occurrence_id, 'occurrence_claimed', (SELECT now FROM cycle_clock),
           CAST(:p_owner AS varchar), fence,
           '{"attempt":' || attempt || ',"previousOwner":' || 'null' || ',"previousStatus":"' || previous_status || '"}'
    FROM claimed
    RETURNING 1
)
SELECT CAST(CASE WHEN (SELECT count(*) FROM settled) = 1
                  AND ((SELECT count(*) FROM claimed) = 1 OR (SELECT count(*) FROM probe) = 0)
                  AND (SELECT count(*) FROM ev) = 1 + (SELECT count(*) FROM claimed)
                  AND (SELECT now FROM cycle_clock) + CAST(:p_lease AS bigint) <= 9007199254740991
                 THEN '1' ELSE 'scheduler:kept-writes-changed' END AS integer) AS checked,
       cycle_clock.now AS server_now,
       s.occurrence_id AS s_occurrence_id, s.job_id AS s_job_id, s.job_revision AS s_job_revision,
       s.idempotency_key AS s_idempotency_key, s.trigger_key AS s_trigger_key,
       s.scheduled_for AS s_scheduled_for, s.available_at AS s_available_at, s.status AS s_status,
       s.attempt AS s_attempt, s.max_attempts AS s_max_attempts, s.fence AS s_fence,
       s.lease_owner AS s_lease_owner, s.lease_expires_at AS s_lease_expires_at,
       s.authority_json AS s_authority_json, s.payload_json AS s_payload_json,
       s.last_error_json AS s_last_error_json, s.result_json AS s_result_json,
       s.created_at AS s_created_at, s.updated_at AS s_updated_at, s.settled_at AS s_settled_at,
       cl.occurrence_id AS c_occurrence_id, cl.job_id AS c_job_id, cl.job_revision AS c_job_revision,
       cl.idempotency_key AS c_idempotency_key, cl.trigger_key AS c_trigger_key,
       cl.scheduled_for AS c_scheduled_for, cl.available_at AS c_available_at, cl.status AS c_status,
       cl.attempt AS c_attempt, cl.max_attempts AS c_max_attempts, cl.fence AS c_fence,
       cl.lease_owner AS c_lease_owner, cl.lease_expires_at AS c_lease_expires_at,
       cl.authority_json AS c_authority_json, cl.payload_json AS c_payload_json,
       cl.last_error_json AS c_last_error_json, cl.result_json AS c_result_json,
       cl.created_at AS c_created_at, cl.updated_at AS c_updated_at, cl.settled_at AS c_settled_at,
       cl.previous_status AS c_previous_status, cl.position AS c_position
FROM cycle_clock
LEFT JOIN settled AS s ON true
LEFT JOIN claimed AS cl ON true


-- name: enqueue_lock
-- The lead of an enqueue in one statement: the advisory lock enqueue_in takes on the identity's
-- key (Tx.lock_keys: :space is the schema's "enqueue" key space, :lock_key the job, time and
-- trigger key), so that the enqueue statement's snapshot, taken after it, sees every committed
-- enqueue of the same identity.
SELECT pg_advisory_xact_lock(CAST(:space AS integer), hashtext(CAST(:lock_key AS text))) AS locked


-- name: enqueue
-- enqueue_occurrence of a new identity, sent with BEGIN and COMMIT in one round trip after
-- enqueue_lock: it reads the job and the clock, inserts the occurrence and its event, and
-- notifies the wake channel. Parameters: :job_id, :trigger_key, :scheduled_for, :available_at;
-- :payload_json (the caller's payload as canonical JSON, or NULL: the job's); :now (as above);
-- :job_texts (the sha256 of the job's authority, payload and trigger texts as the caller verified
-- them, or NULL); :identity_head and :identity_tail (hex of the bytes the identity's digest is taken
-- of before and after the revision's digits); :event_tail (the event data after the revision);
-- :channel (the wake channel).
-- It writes only when the job exists, is enabled, has a revision the identity accepts and stored
-- texts that are the ones verified, and when no row holds the identity (ON CONFLICT: any unique
-- key). The first column fails the statement, and the COMMIT with it, otherwise; but for a job
-- whose texts are not the ones verified: then nothing is written, and the row carries the job's
-- texts for the caller to verify. Either way the call then runs again the usual way.
WITH enqueue_job AS MATERIALIZED (
    SELECT j.revision, j.enabled, j.max_attempts, j.authority_json, j.payload_json, j.trigger_json,
           encode(sha256(convert_to(j.authority_json, 'UTF8') || decode('00', 'hex')
                         || convert_to(j.payload_json, 'UTF8') || decode('00', 'hex')
                         || convert_to(j.trigger_json, 'UTF8')), 'hex')
               IS NOT DISTINCT FROM CAST(:job_texts AS text) AS verified
    FROM {jobs} AS j
    WHERE j.job_id = :job_id
),
enqueue_clock AS MATERIALIZED (
    SELECT coalesce(CAST(:now AS bigint), floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) AS now
),
identity AS MATERIALIZED (  -- derive_occurrence_identity of the job's revision
    SELECT encode(sha256(decode(CAST(:identity_head AS text), 'hex')
                         || convert_to(CAST(revision AS text), 'UTF8')
                         || decode(CAST(:identity_tail AS text), 'hex')), 'hex') AS digest,
           revision, max_attempts, authority_json, payload_json
    FROM enqueue_job
    WHERE verified AND enabled = 1 AND revision BETWEEN 1 AND 9007199254740991
),
inserted AS (
    INSERT INTO {occurrences} (occurrence_id, job_id, job_revision, idempotency_key, trigger_key,
                               scheduled_for, available_at, status, attempt, max_attempts, fence,
                               lease_owner, lease_expires_at, authority_json, payload_json,
                               last_error_json, result_json, created_at, updated_at, settled_at)
    SELECT 'occ_' || i.digest, CAST(:job_id AS text), i.revision, 'scheduler:v1:' || i.digest,
           CAST(:trigger_key AS text), CAST(:scheduled_for AS bigint), CAST(:available_at AS bigint),
           'queued', 0, i.max_attempts, 0, NULL, NULL, i.authority_json,
           coalesce(CAST(:payload_json AS text), i.payload_json), NULL, NULL, c.now, c.now, NULL
    FROM identity AS i, enqueue_clock AS c
    ON CONFLICT DO NOTHING
    RETURNING *
),
enqueued_event AS (
    INSERT INTO {events} (job_id, occurrence_id, event_type, occurred_at, owner_id, fence, data_json)
    SELECT job_id, occurrence_id, 'occurrence_enqueued', created_at, NULL, NULL,
           '{"jobRevision":' || job_revision || CAST(:event_tail AS text)
    FROM inserted
    RETURNING 1
),
woken AS MATERIALIZED (
    SELECT pg_notify(CAST(:channel AS text), '') AS sent FROM inserted
)
SELECT CAST(CASE WHEN (SELECT count(*) FROM inserted) = 1
                  AND (SELECT count(*) FROM enqueued_event) = 1
                  AND (SELECT count(*) FROM woken) = 1
                 THEN '1'
                 WHEN (SELECT NOT verified FROM enqueue_job) THEN '1'
                 ELSE 'scheduler:kept-writes-changed' END AS integer) AS checked,
       c.now AS server_now,
       o.occurrence_id, o.job_id, o.job_revision, o.idempotency_key, o.trigger_key, o.scheduled_for,
       o.available_at, o.status, o.attempt, o.max_attempts, o.fence, o.lease_owner,
       o.lease_expires_at, o.authority_json, o.payload_json, o.last_error_json, o.result_json,
       o.created_at, o.updated_at, o.settled_at,
       CASE WHEN NOT j.verified THEN j.authority_json END AS job_authority_json,
       CASE WHEN NOT j.verified THEN j.payload_json END AS job_payload_json,
       CASE WHEN NOT j.verified THEN j.trigger_json END AS job_trigger_json
FROM enqueue_clock AS c
LEFT JOIN inserted AS o ON true
LEFT JOIN enqueue_job AS j ON true


-- name: claim
-- A quiet claim_next in one statement, sent with BEGIN and COMMIT in one round trip
-- (claim_statement.py): the clock, the heads as cycle reads them, the earliest head locked SKIP
-- LOCKED if plain, claimed at its version as probed, and its event. The first column fails the
-- statement (and the COMMIT with it) unless the head was claimed or nothing is due, and the
-- lease expiry is representable: the call then runs again the usual way. It takes :now,
-- :job_kinds, :workspace_id, :p_owner and :p_lease only.
WITH claim_clock AS MATERIALIZED (  -- the clock, read once (no lock precedes it)
    SELECT coalesce(CAST(:now AS bigint), floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) AS now
),
heads AS (
    (SELECT 'q' AS arm, occurrence_id
     FROM {occurrences}
     WHERE status = 'queued' AND available_at <= (SELECT now FROM claim_clock)
     ORDER BY available_at, lease_expires_at, scheduled_for, occurrence_id
     LIMIT 1)
    UNION ALL
    (SELECT 'r', occurrence_id
     FROM {occurrences}
     WHERE status = 'retry_wait' AND available_at <= (SELECT now FROM claim_clock)
     ORDER BY available_at, lease_expires_at, scheduled_for, occurrence_id
     LIMIT 1)
    UNION ALL
    (SELECT 'e', o.occurrence_id
     FROM {occurrences} AS o
     LEFT JOIN {scheduler_occurrence_controls} AS c ON c.occurrence_id = o.occurrence_id
     WHERE o.status = 'running' AND o.lease_expires_at <= (SELECT now FROM claim_clock)
       AND (    (o.attempt >= o.max_attempts
                 AND (c.state IS NULL OR (c.state <> 'pause_requested' AND c.state <> 'resumed')))
            OR  (EXISTS (SELECT 1 FROM {jobs} AS j
                         WHERE j.job_id = o.job_id AND j.enabled = 1
                           AND (CAST(:job_kinds AS text[]) IS NULL OR j.kind = ANY (CAST(:job_kinds AS text[])))
                           AND (CAST(:workspace_id AS text) IS NULL
                                OR CAST(j.authority_json AS json) ->> 'workspaceId' = CAST(:workspace_id AS text))
                         OFFSET 0)
                 AND (o.attempt < o.max_attempts OR c.state = 'pause_requested' OR c.state = 'resumed'
                      OR EXISTS (SELECT 1 FROM {scheduler_occurrence_retries} AS r
                                 WHERE r.occurrence_id = o.occurrence_id AND r.claimed_at IS NULL
                                   AND r.expected_fence = o.fence))
                 AND (c.state IS NULL OR c.state <> 'paused')))
     ORDER BY o.lease_expires_at, o.occurrence_id
     LIMIT 1)
),
probe AS MATERIALIZED (  -- what the statement reads of its heads
    SELECT h.arm, o.occurrence_id, o.status, o.attempt, o.max_attempts, o.fence, o.available_at,
           o.scheduled_for, c.state AS control_state,
           (SELECT r.request_id FROM {scheduler_occurrence_retries} AS r
            WHERE r.occurrence_id = o.occurrence_id AND r.claimed_at IS NULL AND r.expected_fence = o.fence
            LIMIT 1) AS retry_request_id,
           EXISTS (SELECT 1 FROM {jobs} AS j
                   WHERE j.job_id = o.job_id AND j.enabled = 1
                     AND (CAST(:job_kinds AS text[]) IS NULL OR j.kind = ANY (CAST(:job_kinds AS text[])))
                     AND (CAST(:workspace_id AS text) IS NULL
                          OR CAST(j.authority_json AS json) ->> 'workspaceId' = CAST(:workspace_id AS text))
                   OFFSET 0) AS job_ok
    FROM heads AS h
    JOIN {occurrences} AS o ON o.occurrence_id = h.occurrence_id
    LEFT JOIN {scheduler_occurrence_controls} AS c ON c.occurrence_id = o.occurrence_id
),
head AS (
    SELECT occurrence_id,
           job_ok AND control_state IS NULL AND retry_request_id IS NULL AND attempt < max_attempts AS plain
    FROM probe
    WHERE arm <> 'e' AND NOT EXISTS (SELECT 1 FROM probe WHERE arm = 'e')
    ORDER BY available_at, scheduled_for, occurrence_id
    LIMIT 1
),
locked AS MATERIALIZED (
    SELECT o.occurrence_id, o.fence, o.status, 1 AS position
    FROM {occurrences} AS o
    JOIN head ON head.occurrence_id = o.occurrence_id
    WHERE head.plain
    FOR UPDATE OF o SKIP LOCKED
),
claimed AS (  -- the claim's guarded UPDATE of the locked head, at its version as probed
    UPDATE {occurrences} AS o
    SET status = 'running', attempt = o.attempt + 1, fence = o.fence + 1, lease_owner = :p_owner,
        lease_expires_at = (SELECT now FROM claim_clock) + CAST(:p_lease AS bigint),
        updated_at = (SELECT now FROM claim_clock), settled_at = NULL
    FROM locked
    WHERE o.occurrence_id = locked.occurrence_id AND o.fence = locked.fence
      AND NOT EXISTS (SELECT 1 FROM {scheduler_occurrence_controls} AS c WHERE c.occurrence_id = o.occurrence_id)
      AND NOT EXISTS (SELECT 1 FROM {scheduler_occurrence_retries} AS r
                      WHERE r.occurrence_id = o.occurrence_id AND r.claimed_at IS NULL
                        AND r.expected_fence = o.fence)
      AND EXISTS (SELECT 1 FROM {jobs} AS j WHERE j.job_id = o.job_id AND j.enabled = 1)
      AND (o.occurrence_id || ':' || o.fence || ':' || o.status || ':' || o.attempt || ':'
           || o.available_at || ':' || o.scheduled_for)
          = (SELECT p.occurrence_id || ':' || p.fence || ':' || p.status || ':' || p.attempt || ':'
                    || p.available_at || ':' || p.scheduled_for
             FROM probe AS p WHERE p.occurrence_id = locked.occurrence_id)
      AND o.lease_owner IS NULL
      AND (SELECT now FROM claim_clock) + CAST(:p_lease AS bigint) <= 9007199254740991
    RETURNING o.*, locked.status AS previous_status, locked.position
),
ev AS (
    INSERT INTO {events} (job_id, occurrence_id, event_type, occurred_at, owner_id, fence, data_json)
    SELECT job_id, occurrence_id, 'occurrence_claimed', (SELECT now FROM claim_clock),
           CAST(:p_owner AS varchar), fence,
           '{"attempt":' || attempt || ',"previousOwner":' || 'null' || ',"previousStatus":"' || previous_status || '"}'
    FROM claimed
    RETURNING 1
)
SELECT CAST(CASE WHEN ((SELECT count(*) FROM claimed) = 1 OR (SELECT count(*) FROM probe) = 0)
                  AND (SELECT count(*) FROM ev) = (SELECT count(*) FROM claimed)
                  AND (SELECT now FROM claim_clock) + CAST(:p_lease AS bigint) <= 9007199254740991
                 THEN '1' ELSE 'scheduler:kept-writes-changed' END AS integer) AS checked,
       claim_clock.now AS server_now,
       cl.occurrence_id AS c_occurrence_id, cl.job_id AS c_job_id, cl.job_revision AS c_job_revision,
       cl.idempotency_key AS c_idempotency_key, cl.trigger_key AS c_trigger_key,
       cl.scheduled_for AS c_scheduled_for, cl.available_at AS c_available_at, cl.status AS c_status,
       cl.attempt AS c_attempt, cl.max_attempts AS c_max_attempts, cl.fence AS c_fence,
       cl.lease_owner AS c_lease_owner, cl.lease_expires_at AS c_lease_expires_at,
       cl.authority_json AS c_authority_json, cl.payload_json AS c_payload_json,
       cl.last_error_json AS c_last_error_json, cl.result_json AS c_result_json,
       cl.created_at AS c_created_at, cl.updated_at AS c_updated_at, cl.settled_at AS c_settled_at,
       cl.previous_status AS c_previous_status, cl.position AS c_position
FROM claim_clock
LEFT JOIN claimed AS cl ON true


-- name: claim_window
-- claim among workers that hold the first candidates: the window of heads ranked and cut as
-- cycle_window does, the first free candidate locked SKIP LOCKED at its version as read and
-- claimed; c_position tells the caller whether the first candidate was free.
WITH claim_clock AS MATERIALIZED (  -- the clock, read once (no lock precedes it)
    SELECT coalesce(CAST(:now AS bigint), floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) AS now
),
heads AS (
    (SELECT 'q' AS arm, occurrence_id
     FROM {occurrences}
     WHERE status = 'queued' AND available_at <= (SELECT now FROM claim_clock)
     ORDER BY available_at, lease_expires_at, scheduled_for, occurrence_id
     LIMIT 8)
    UNION ALL
    (SELECT 'r', occurrence_id
     FROM {occurrences}
     WHERE status = 'retry_wait' AND available_at <= (SELECT now FROM claim_clock)
     ORDER BY available_at, lease_expires_at, scheduled_for, occurrence_id
     LIMIT 8)
    UNION ALL
    (SELECT 'e', o.occurrence_id
     FROM {occurrences} AS o
     LEFT JOIN {scheduler_occurrence_controls} AS c ON c.occurrence_id = o.occurrence_id
     WHERE o.status = 'running' AND o.lease_expires_at <= (SELECT now FROM claim_clock)
       AND (    (o.attempt >= o.max_attempts
                 AND (c.state IS NULL OR (c.state <> 'pause_requested' AND c.state <> 'resumed')))
            OR  (EXISTS (SELECT 1 FROM {jobs} AS j
                         WHERE j.job_id = o.job_id AND j.enabled = 1
                           AND (CAST(:job_kinds AS text[]) IS NULL OR j.kind = ANY (CAST(:job_kinds AS text[])))
                           AND (CAST(:workspace_id AS text) IS NULL
                                OR CAST(j.authority_json AS json) ->> 'workspaceId' = CAST(:workspace_id AS text))
                         OFFSET 0)
                 AND (o.attempt < o.max_attempts OR c.state = 'pause_requested' OR c.state = 'resumed'
                      OR EXISTS (SELECT 1 FROM {scheduler_occurrence_retries} AS r
                                 WHERE r.occurrence_id = o.occurrence_id AND r.claimed_at IS NULL
                                   AND r.expected_fence = o.fence))
                 AND (c.state IS NULL OR c.state <> 'paused')))
     ORDER BY o.lease_expires_at, o.occurrence_id
     LIMIT 1)
),
probe AS MATERIALIZED (
    SELECT h.arm, o.occurrence_id, o.status, o.attempt, o.max_attempts, o.fence, o.available_at,
           o.scheduled_for, c.state AS control_state,
           (SELECT r.request_id FROM {scheduler_occurrence_retries} AS r
            WHERE r.occurrence_id = o.occurrence_id AND r.claimed_at IS NULL AND r.expected_fence = o.fence
            LIMIT 1) AS retry_request_id,
           EXISTS (SELECT 1 FROM {jobs} AS j
                   WHERE j.job_id = o.job_id AND j.enabled = 1
                     AND (CAST(:job_kinds AS text[]) IS NULL OR j.kind = ANY (CAST(:job_kinds AS text[])))
                     AND (CAST(:workspace_id AS text) IS NULL
                          OR CAST(j.authority_json AS json) ->> 'workspaceId' = CAST(:workspace_id AS text))
                   OFFSET 0) AS job_ok
    FROM heads AS h
    JOIN {occurrences} AS o ON o.occurrence_id = h.occurrence_id
    LEFT JOIN {scheduler_occurrence_controls} AS c ON c.occurrence_id = o.occurrence_id
),
ranked AS (  -- the window's due rows in the seed's order (none when an expired lease is to be acted on)
    SELECT occurrence_id,
           occurrence_id || ':' || fence || ':' || status || ':' || attempt || ':' || available_at || ':'
               || scheduled_for AS version,
           (job_ok AND control_state IS NULL AND retry_request_id IS NULL AND attempt < max_attempts)
               IS TRUE AS plain,
           row_number() OVER (ORDER BY available_at, scheduled_for, occurrence_id) AS position,
           row_number() OVER (PARTITION BY arm ORDER BY available_at, scheduled_for, occurrence_id) AS arm_rank,
           count(*) OVER (PARTITION BY arm) AS arm_rows
    FROM probe
    WHERE arm <> 'e' AND NOT EXISTS (SELECT 1 FROM probe WHERE arm = 'e')
),
locked AS MATERIALIZED (  -- the first free candidate, locked at its version as read
    SELECT o.occurrence_id, o.fence, o.status, ranked.position
    FROM {occurrences} AS o
    JOIN ranked ON ranked.occurrence_id = o.occurrence_id
    WHERE ranked.plain
      AND ranked.position <= coalesce(
              (SELECT min(CASE WHEN NOT plain THEN position - 1
                               WHEN arm_rows = 8 AND arm_rank = 8 THEN position END)
               FROM ranked),
              ranked.position)
      AND (o.occurrence_id || ':' || o.fence || ':' || o.status || ':' || o.attempt || ':'
           || o.available_at || ':' || o.scheduled_for) = ranked.version
    ORDER BY ranked.position
    LIMIT 1
    FOR UPDATE OF o SKIP LOCKED
),
claimed AS (
    UPDATE {occurrences} AS o
    SET status = 'running', attempt = o.attempt + 1, fence = o.fence + 1, lease_owner = :p_owner,
        lease_expires_at = (SELECT now FROM claim_clock) + CAST(:p_lease AS bigint),
        updated_at = (SELECT now FROM claim_clock), settled_at = NULL
    FROM locked
    WHERE o.occurrence_id = locked.occurrence_id AND o.fence = locked.fence
      AND NOT EXISTS (SELECT 1 FROM {scheduler_occurrence_controls} AS c WHERE c.occurrence_id = o.occurrence_id)
      AND NOT EXISTS (SELECT 1 FROM {scheduler_occurrence_retries} AS r
                      WHERE r.occurrence_id = o.occurrence_id AND r.claimed_at IS NULL
                        AND r.expected_fence = o.fence)
      AND EXISTS (SELECT 1 FROM {jobs} AS j WHERE j.job_id = o.job_id AND j.enabled = 1)
      AND (o.occurrence_id || ':' || o.fence || ':' || o.status || ':' || o.attempt || ':'
           || o.available_at || ':' || o.scheduled_for)
          = (SELECT p.occurrence_id || ':' || p.fence || ':' || p.status || ':' || p.attempt || ':'
                    || p.available_at || ':' || p.scheduled_for
             FROM probe AS p WHERE p.occurrence_id = locked.occurrence_id)
      AND o.lease_owner IS NULL
      AND (SELECT now FROM claim_clock) + CAST(:p_lease AS bigint) <= 9007199254740991
    RETURNING o.*, locked.status AS previous_status, locked.position
),
ev AS (
    INSERT INTO {events} (job_id, occurrence_id, event_type, occurred_at, owner_id, fence, data_json)
    SELECT job_id, occurrence_id, 'occurrence_claimed', (SELECT now FROM claim_clock),
           CAST(:p_owner AS varchar), fence,
           '{"attempt":' || attempt || ',"previousOwner":' || 'null' || ',"previousStatus":"' || previous_status || '"}'
    FROM claimed
    RETURNING 1
)
SELECT CAST(CASE WHEN ((SELECT count(*) FROM claimed) = 1 OR (SELECT count(*) FROM probe) = 0)
                  AND (SELECT count(*) FROM ev) = (SELECT count(*) FROM claimed)
                  AND (SELECT now FROM claim_clock) + CAST(:p_lease AS bigint) <= 9007199254740991
                 THEN '1' ELSE 'scheduler:kept-writes-changed' END AS integer) AS checked,
       claim_clock.now AS server_now,
       cl.occurrence_id AS c_occurrence_id, cl.job_id AS c_job_id, cl.job_revision AS c_job_revision,
       cl.idempotency_key AS c_idempotency_key, cl.trigger_key AS c_trigger_key,
       cl.scheduled_for AS c_scheduled_for, cl.available_at AS c_available_at, cl.status AS c_status,
       cl.attempt AS c_attempt, cl.max_attempts AS c_max_attempts, cl.fence AS c_fence,
       cl.lease_owner AS c_lease_owner, cl.lease_expires_at AS c_lease_expires_at,
       cl.authority_json AS c_authority_json, cl.payload_json AS c_payload_json,
       cl.last_error_json AS c_last_error_json, cl.result_json AS c_result_json,
       cl.created_at AS c_created_at, cl.updated_at AS c_updated_at, cl.settled_at AS c_settled_at,
       cl.previous_status AS c_previous_status, cl.position AS c_position
FROM claim_clock
LEFT JOIN claimed AS cl ON true


-- name: settle
-- A settle that succeeds in one statement, sent with BEGIN and COMMIT in one round trip after a
-- lead statement that locks the row (settle_statement.py): the clock, read after that lock, the
-- settlement's guarded UPDATE for a success and its event. The first column fails the statement
-- (and the COMMIT with it) unless the row was settled: a lost lease, or a control, reservation or
-- adjudication row, runs the call again the usual way. It takes :p_id, :p_owner, :p_fence,
-- :p_result and :now only.
WITH settle_clock AS MATERIALIZED (  -- read after the lead's lock
    SELECT coalesce(CAST(:now AS bigint), floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) AS now
),
settled AS (
    UPDATE {occurrences} AS o
    SET status = 'succeeded', lease_owner = NULL, lease_expires_at = NULL, last_error_json = NULL,
        result_json = :p_result,
        updated_at = (SELECT now FROM settle_clock), settled_at = (SELECT now FROM settle_clock)
    WHERE o.occurrence_id = :p_id
      AND (o.status = 'running') IS TRUE
      AND o.lease_owner = :p_owner AND o.fence = CAST(:p_fence AS bigint)
      AND o.lease_expires_at > (SELECT now FROM settle_clock)
      AND NOT EXISTS (SELECT 1 FROM {scheduler_occurrence_controls} AS c WHERE c.occurrence_id = o.occurrence_id)
      AND NOT EXISTS (SELECT 1 FROM {scheduler_authority_reservations} AS res WHERE res.occurrence_id = o.occurrence_id)
      AND NOT EXISTS (SELECT 1 FROM {scheduler_occurrence_adjudications} AS adj WHERE adj.occurrence_id = o.occurrence_id)
    RETURNING o.*
),
ev AS (
    INSERT INTO {events} (job_id, occurrence_id, event_type, occurred_at, owner_id, fence, data_json)
    SELECT job_id, occurrence_id, 'occurrence_succeeded', (SELECT now FROM settle_clock),
           CAST(:p_owner AS varchar), fence,
           '{"attempt":' || attempt || ',"maxAttempts":' || max_attempts || '}'
    FROM settled
    RETURNING 1
)
SELECT CAST(CASE WHEN (SELECT count(*) FROM settled) = 1 AND (SELECT count(*) FROM ev) = 1
                 THEN '1' ELSE 'scheduler:kept-writes-changed' END AS integer) AS checked,
       settle_clock.now AS server_now,
       s.occurrence_id AS s_occurrence_id, s.job_id AS s_job_id, s.job_revision AS s_job_revision,
       s.idempotency_key AS s_idempotency_key, s.trigger_key AS s_trigger_key,
       s.scheduled_for AS s_scheduled_for, s.available_at AS s_available_at, s.status AS s_status,
       s.attempt AS s_attempt, s.max_attempts AS s_max_attempts, s.fence AS s_fence,
       s.lease_owner AS s_lease_owner, s.lease_expires_at AS s_lease_expires_at,
       s.authority_json AS s_authority_json, s.payload_json AS s_payload_json,
       s.last_error_json AS s_last_error_json, s.result_json AS s_result_json,
       s.created_at AS s_created_at, s.updated_at AS s_updated_at, s.settled_at AS s_settled_at
FROM settle_clock
LEFT JOIN settled AS s ON true
