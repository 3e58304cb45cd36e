-- The migration's session waits for locks as long as it needs: a concurrent index build waits for
-- the transactions before it, and cut short it would leave an INVALID index behind.
SET lock_timeout = 0
