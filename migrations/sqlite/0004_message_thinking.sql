-- The reasoning that came with an assistant message: a JSON array of thinking blocks, kept as
-- the provider sent them (a signed block must go back to it unchanged); NULL when there was none.
ALTER TABLE messages ADD COLUMN thinking TEXT;
