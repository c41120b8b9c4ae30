"""The text-to-SQL multi-agent task (after Agent Lightning's Spider task): seeded SQLite
databases with questions and gold queries, and the execution-match reward."""
