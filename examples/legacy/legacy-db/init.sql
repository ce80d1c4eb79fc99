-- Springfield Electric's legacy billing schema and seed data, as in MeshQL's examples/legacy:
-- upper-case codes, YYYYMMDD dates as text, amounts in cents, Y/N flags. meshql never writes
-- here; the example's processors read these tables by logical replication.
--
-- Load it into a database of its own on a server with wal_level = logical, e.g. the one
-- scripts/services/postgres.sh starts:
--   createdb -h 127.0.0.1 -p 55432 -U postgres springfield_electric
--   psql -h 127.0.0.1 -p 55432 -U postgres -d springfield_electric -f examples/legacy/legacy-db/init.sql

CREATE TABLE CUST_ACCT (
    ACCT_ID       SERIAL PRIMARY KEY,
    ACCT_NUM      VARCHAR(12) NOT NULL UNIQUE,
    CUST_NM_FIRST VARCHAR(30) NOT NULL,
    CUST_NM_LAST  VARCHAR(30) NOT NULL,
    ADDR_LN1      VARCHAR(60),
    ADDR_LN2      VARCHAR(60),
    ADDR_CITY     VARCHAR(30),
    ADDR_ST       VARCHAR(2),
    ADDR_ZIP      VARCHAR(10),
    PHONE_NUM     VARCHAR(15),
    EMAIL_ADDR    VARCHAR(60),
    RT_CD         VARCHAR(3) NOT NULL,  -- RES / COM / IND
    SVC_TYPE      VARCHAR(1) NOT NULL,  -- E / G / B
    STAT_CD       VARCHAR(1) NOT NULL,  -- A / S / C
    CONN_DT       VARCHAR(8) NOT NULL,  -- YYYYMMDD
    DISC_DT       VARCHAR(8),
    BUDGET_FLG    VARCHAR(1) DEFAULT 'N',
    PAPERLESS_FLG VARCHAR(1) DEFAULT 'N'
);

CREATE TABLE MTR_RDNG (
    RDNG_ID       SERIAL PRIMARY KEY,
    ACCT_ID       INT NOT NULL REFERENCES CUST_ACCT (ACCT_ID),
    MTR_NUM       VARCHAR(12) NOT NULL,
    RDNG_DT       VARCHAR(8) NOT NULL,
    RDNG_VAL      INT NOT NULL,         -- cumulative kWh
    PREV_RDNG_VAL INT,
    RDNG_TYPE     VARCHAR(1) NOT NULL,  -- A / E / C
    EST_FLG       VARCHAR(1) DEFAULT 'N',
    BILLED_FLG    VARCHAR(1) DEFAULT 'N'
);

CREATE TABLE BILL_HDR (
    BILL_ID       SERIAL PRIMARY KEY,
    ACCT_ID       INT NOT NULL REFERENCES CUST_ACCT (ACCT_ID),
    BILL_DT       VARCHAR(8) NOT NULL,
    DUE_DT        VARCHAR(8) NOT NULL,
    BILL_PRD_FROM VARCHAR(8) NOT NULL,
    BILL_PRD_TO   VARCHAR(8) NOT NULL,
    TOT_AMT       INT NOT NULL,         -- cents
    KWH_USED      INT NOT NULL,
    STAT_CD       VARCHAR(1) NOT NULL,  -- O / P / D / X
    LATE_FLG      VARCHAR(1) DEFAULT 'N'
);

CREATE TABLE PYMT_HIST (
    PYMT_ID       SERIAL PRIMARY KEY,
    ACCT_ID       INT NOT NULL REFERENCES CUST_ACCT (ACCT_ID),
    BILL_ID       INT REFERENCES BILL_HDR (BILL_ID),
    PYMT_DT       VARCHAR(8) NOT NULL,
    PYMT_AMT      INT NOT NULL,         -- cents
    PYMT_MTHD     VARCHAR(1) NOT NULL,  -- W / E / K / C / P
    CONF_NUM      VARCHAR(20),
    STAT_CD       VARCHAR(1) DEFAULT 'S' -- S / F / R
);

-- whole rows in the change stream: an update or delete carries every column
ALTER TABLE CUST_ACCT REPLICA IDENTITY FULL;
ALTER TABLE MTR_RDNG REPLICA IDENTITY FULL;
ALTER TABLE BILL_HDR REPLICA IDENTITY FULL;
ALTER TABLE PYMT_HIST REPLICA IDENTITY FULL;

INSERT INTO CUST_ACCT (ACCT_NUM, CUST_NM_FIRST, CUST_NM_LAST, ADDR_LN1, ADDR_LN2, ADDR_CITY, ADDR_ST,
                       ADDR_ZIP, PHONE_NUM, EMAIL_ADDR, RT_CD, SVC_TYPE, STAT_CD, CONN_DT, DISC_DT,
                       BUDGET_FLG, PAPERLESS_FLG) VALUES
  ('100100-00001', 'MARGARET', 'HENDERSON', '742 EVERGREEN TERRACE', NULL, 'SPRINGFIELD', 'IL',
   '62704', '217-555-0142', 'MHENDERSON@EMAIL.COM', 'RES', 'E', 'A', '19980315', NULL, 'Y', 'N'),
  ('200200-00002', 'KENJI', 'NAKAMURA', '1200 INDUSTRIAL PKWY', 'SUITE 300', 'SPRINGFIELD', 'IL',
   '62707', '217-555-0190', 'KNAKAMURA@NAKAMURA-MFG.COM', 'COM', 'B', 'A', '20050601', NULL, 'N', 'Y'),
  ('100100-00003', 'SIOBHAN', 'OCONNELL', '88 OAK STREET', NULL, 'SPRINGFIELD', 'IL',
   '62702', '217-555-0163', NULL, 'RES', 'E', 'S', '20120910', NULL, 'N', 'N'),
  ('300300-00004', 'JAMES', 'WHITFIELD', '5000 RIVER ROAD', NULL, 'SPRINGFIELD', 'IL',
   '62711', '217-555-0177', 'JWHITFIELD@WHITFIELD-STEEL.COM', 'IND', 'E', 'A', '20010220', NULL, 'N', 'Y');

-- monthly readings; kWh used = RDNG_VAL - PREV_RDNG_VAL
INSERT INTO MTR_RDNG (ACCT_ID, MTR_NUM, RDNG_DT, RDNG_VAL, PREV_RDNG_VAL, RDNG_TYPE, EST_FLG, BILLED_FLG) VALUES
  (1, 'M-10042', '20250601', 45950, 45000, 'A', 'N', 'Y'),
  (1, 'M-10042', '20250701', 47080, 45950, 'A', 'N', 'Y'),
  (1, 'M-10042', '20250801', 49030, 47080, 'E', 'Y', 'Y'),
  (1, 'M-10042', '20250901', 49900, 49030, 'A', 'N', 'N'),
  (2, 'M-20087', '20250601', 124200, 120000, 'A', 'N', 'Y'),
  (2, 'M-20087', '20250701', 128900, 124200, 'A', 'N', 'Y'),
  (2, 'M-20087', '20250801', 133300, 128900, 'A', 'N', 'Y'),
  (2, 'M-20087', '20250901', 137000, 133300, 'A', 'N', 'N'),
  (3, 'M-10098', '20250601', 30800, 30000, 'E', 'Y', 'Y'),
  (3, 'M-10098', '20250701', 31500, 30800, 'A', 'N', 'N'),
  (4, 'M-30015', '20250601', 514000, 500000, 'A', 'N', 'Y'),
  (4, 'M-30015', '20250701', 528500, 514000, 'A', 'N', 'Y'),
  (4, 'M-30015', '20250801', 543800, 528500, 'A', 'N', 'Y'),
  (4, 'M-30015', '20250901', 557400, 543800, 'A', 'N', 'N');

-- bills: billed on the 15th, due on the 15th of the next month, for the month
INSERT INTO BILL_HDR (ACCT_ID, BILL_DT, DUE_DT, BILL_PRD_FROM, BILL_PRD_TO, TOT_AMT, KWH_USED, STAT_CD, LATE_FLG) VALUES
  (1, '20250615', '20250715', '20250601', '20250630', 9840, 950, 'P', 'N'),
  (1, '20250715', '20250815', '20250701', '20250731', 11720, 1130, 'P', 'N'),
  (1, '20250815', '20250915', '20250801', '20250831', 20220, 1950, 'O', 'N'),
  (2, '20250615', '20250715', '20250601', '20250630', 42000, 4200, 'P', 'N'),
  (2, '20250715', '20250815', '20250701', '20250731', 47000, 4700, 'P', 'N'),
  (2, '20250815', '20250915', '20250801', '20250831', 44000, 4400, 'O', 'N'),
  (3, '20250615', '20250715', '20250601', '20250630', 8300, 800, 'D', 'Y'),
  (3, '20250715', '20250815', '20250701', '20250731', 7250, 700, 'D', 'Y'),
  (4, '20250615', '20250715', '20250601', '20250630', 98000, 14000, 'P', 'N'),
  (4, '20250815', '20250915', '20250801', '20250831', 106200, 15300, 'O', 'N');

-- payments (the last one is for bill 10 with bill 9's amount and date, as in MeshQL's original seed data)
INSERT INTO PYMT_HIST (ACCT_ID, BILL_ID, PYMT_DT, PYMT_AMT, PYMT_MTHD, CONF_NUM, STAT_CD) VALUES
  (1, 1, '20250702', 9840, 'W', 'WEB-20250702-001', 'S'),
  (1, 2, '20250810', 11720, 'W', 'WEB-20250810-002', 'S'),
  (2, 4, '20250620', 42000, 'E', 'ACH-20250620-001', 'S'),
  (2, 5, '20250725', 47000, 'E', 'ACH-20250725-002', 'S'),
  (4, 10, '20250630', 98000, 'K', 'CHK-004872', 'S');
