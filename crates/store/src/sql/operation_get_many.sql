-- Operations by id (a batch's answer, read inside its transaction).
SELECT * FROM operations WHERE id = ANY($1::uuid[])
