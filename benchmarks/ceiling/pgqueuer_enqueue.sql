WITH input AS MATERIALIZED (
    SELECT
        nextval(
            (SELECT pg_get_serial_sequence('pgqueuer', 'id'))
        ) AS id,
        priority, entrypoint, payload, execute_after, dedupe_key, headers, ord
    FROM UNNEST(
        ARRAY[0]::int[], ARRAY['noop']::text[], ARRAY['\x31'::bytea],
        ARRAY['0 seconds'::interval], ARRAY[NULL]::text[], ARRAY['null'::jsonb]
    ) WITH ORDINALITY AS
        t(priority, entrypoint, payload, execute_after, dedupe_key, headers, ord)
),
inserted AS (
    INSERT INTO pgqueuer AS job
    (id, priority, entrypoint, payload, execute_after, dedupe_key, headers, status)
    SELECT id, priority, entrypoint, payload, execute_after + NOW(),
        dedupe_key, headers, 'queued'
    FROM input
    RETURNING id, entrypoint, priority, dedupe_key
),
logged AS (
    INSERT INTO pgqueuer_log
    (job_id, status, entrypoint, priority)
    SELECT id, 'queued', entrypoint, priority
    FROM inserted
    WHERE id IN (SELECT id FROM input)
)
SELECT i.ord AS ord, ins.id AS id
FROM inserted ins
JOIN input i ON i.id = ins.id
ORDER BY i.ord;
