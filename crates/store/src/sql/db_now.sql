-- The database's clock (every deadline and decision uses this one clock).
SELECT now()
