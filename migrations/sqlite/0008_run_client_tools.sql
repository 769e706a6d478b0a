-- Tools the client runs, declared for one run only (an AG-UI client's RunAgentInput.tools):
-- a JSON array of {name, description, input_schema}, NULL when the run declared none.
ALTER TABLE runs ADD COLUMN client_tools TEXT;
