-- The role privileges are checked for (SET ROLE at connect changes it).
SELECT current_user
