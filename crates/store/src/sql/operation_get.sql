-- One operation by id.
SELECT * FROM operations WHERE id = $1
