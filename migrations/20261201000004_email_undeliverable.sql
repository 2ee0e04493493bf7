-- An address the receiving server refused as nonexistent (SMTP 550 5.1.1) is marked here;
-- email to it is skipped with reason email_undeliverable until the recipient's address
-- changes (UpsertRecipient with another email clears the mark).
ALTER TABLE recipients
    ADD COLUMN email_undeliverable_at     timestamptz,
    ADD COLUMN email_undeliverable_reason text;
