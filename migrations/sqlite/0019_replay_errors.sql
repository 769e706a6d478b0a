-- Why a replay ended before its last turn did (`interrupted by a restart`), shown in its
-- report; NULL for a replay that ran to its end (or still runs).
ALTER TABLE replays ADD COLUMN error TEXT;
