-- Since when every writer records links in their current shapes (migration 0022); none: no such row.
SELECT since FROM jobtrail_cutovers WHERE name = 'current_link_shapes'
