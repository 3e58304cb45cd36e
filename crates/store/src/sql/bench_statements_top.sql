-- Benchmark only: where this database's time went since the last reset, by statement, most first:
-- the statement's first line (jobtrail's statements open with a comment saying what they do), how
-- often it ran, the rows it touched and its execution time in milliseconds. Top-level statements
-- only, so nothing is counted twice (a trigger's statements are inside the statement that fired it).
SELECT left(split_part(ltrim(query, E' \n'), E'\n', 1), 90) AS label,
       sum(calls)::int8 AS calls, sum(rows)::int8 AS rows, sum(total_exec_time) AS exec_ms
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND toplevel
GROUP BY 1
ORDER BY exec_ms DESC
LIMIT $1
