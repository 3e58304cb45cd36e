-- Row totals: operations, history links, provider calls.
SELECT (SELECT count(*) FROM operations) AS operations,
       (SELECT count(*) FROM operation_history) AS history,
       (SELECT count(*) FROM provider_calls) AS calls
