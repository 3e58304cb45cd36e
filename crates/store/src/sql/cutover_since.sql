-- Since when every writer records links as the verifier expects (`$1`: a cutover's name, as the
-- migration that adds it names it); none: no such row.
SELECT since FROM jobtrail_cutovers WHERE name = $1
