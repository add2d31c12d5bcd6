-- Version 4: a request's budget reservation is recorded in its own row. It is always
-- the request's worst case in the windows of its policy's periods, so the row needs
-- only the windows: `reserved_in` = 'day@<start> month@<start>', NULL once settled
-- (or when nothing was reserved). The reservations table cost two B-tree writes at
-- admission and one at settlement on every request.
ALTER TABLE requests ADD COLUMN reserved_in TEXT;
UPDATE requests SET reserved_in = (
    SELECT group_concat(r.period || '@' || r.window_start, ' ')
    FROM reservations r
    WHERE r.request_id = requests.id AND r.state IN ('held', 'interrupted')
)
WHERE outcome IN ('in_flight', 'interrupted');
DROP TABLE reservations;
